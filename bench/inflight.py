"""Runs in flight: 1,000 concurrent tool-agent runs whose model answers after 10 s, on two
worker processes of this 2-core machine. Model calls are long I/O waits, so the ideal is set
by the runs, not the machine: every run in a model call all the time = runs / latency rounds/s
(100 for 1,000 runs at 10 s). Measured: rounds/s against that ideal over a steady window, the
gap a run spends between two model calls (the engine's own round: commit, tool, next claim),
the workers' total RSS (peak), the peak number of PostgreSQL connections the workers hold, and
CPU per round of the workers, of PostgreSQL's backends and of the whole machine.

The path users run, defaults but `-c`: each worker runs ``-P threads`` with a thread per
concurrent model call (runs / processes + 20) and its default database pool; a model call must
not hold a connection, which the connection count checks. The model is the fake
OpenAI-compatible server in its own process (streamed SSE over HTTP, the latency before the
first byte); each round is one inline read-only HTTP tool call (200-char argument) against an
endpoint in another process, so a round is the real model → commit → tool task → join → next
round task cycle.

    python -m bench.inflight   (BENCH_INFLIGHT_RUNS=1000 — a comma list measures several
                                sizes, e.g. 1000,300 —, BENCH_INFLIGHT_START=spread,burst,
                                BENCH_INFLIGHT_LATENCY=10, BENCH_INFLIGHT_ROUNDS=5,
                                BENCH_INFLIGHT_PROCS=2,
                                BENCH_INFLIGHT_CONCURRENCY=runs/procs+20;
                                writes bench/results/inflight.md)

Two starts. ``spread``: the workers run, then the runs arrive evenly over one latency, as
independent users' runs do; the window opens half a latency after the last arrival. ``burst``:
every run is queued before the workers start, so every first model call goes out in the same
second and every reply comes back in the same second (the worst case: a batch submitted at
once, the end of an outage); the window opens just before the first round's commit, so that it
counts whole waves (a wave is as wide as the first model calls' spread, which can pass half a
latency).
The window lasts two latencies (``BENCH_INFLIGHT_WINDOW``, seconds); five rounds per run keep
it inside the runs' lives.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
import socket
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import sqlalchemy as sa

from bench.common import (
    RESULTS,
    TEXT_500,
    Outside,
    Procs,
    Section,
    close_runtime,
    count_status,
    db_name,
    emit,
    failed_runs,
    log,
    machine,
    machine_cpu,
    med,
    new_prefix,
    num,
    opt_in_label,
    p95,
    pg_backend_cpu,
    pg_cpu_delta,
    proc_cpu,
    proc_rss_mb,
    redis_cleanup,
    retrying,
    scratch_db,
    start_treadle_workers,
    submit,
    treadle_env,
    treadle_runtime,
    verdict,
    wait_for,
)

SIZES = [int(x) for x in os.environ.get("BENCH_INFLIGHT_RUNS", "1000").split(",")]
STARTS = [x for x in os.environ.get("BENCH_INFLIGHT_START", "spread,burst").split(",") if x]
LATENCY = float(os.environ.get("BENCH_INFLIGHT_LATENCY", "10"))
ROUNDS = int(os.environ.get("BENCH_INFLIGHT_ROUNDS", "5"))
PROCS = int(os.environ.get("BENCH_INFLIGHT_PROCS", "2"))
CONC_ENV = os.environ.get("BENCH_INFLIGHT_CONCURRENCY", "")
WINDOW = float(os.environ.get("BENCH_INFLIGHT_WINDOW", str(2 * LATENCY)))
TEXT = TEXT_500[:200]
TARGET = 0.9
EDGE = 0.25  # burst: the window opens this long before the first commit (a whole first wave)
RSS_LIMIT_MB = 1024.0
CONN_LIMIT = 60
BENCH_APP = "bench-inflight"  # application_name of the bench's own connections (not counted)
OUT = RESULTS / "inflight.md"


def concurrency(runs: int) -> int:
    return int(CONC_ENV) if CONC_ENV else math.ceil(runs / PROCS) + 20


def bench_engine(url: str) -> sa.Engine:
    return sa.create_engine(
        url, pool_size=1, max_overflow=1, connect_args={"application_name": BENCH_APP}
    )


def threads_of(pid: int) -> int:
    """The process's thread count (0 once it is gone)."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return 0


class Sampler:
    """Every 0.5 s: connections to the scratch database other than the bench's own (the
    workers'; total and ``active``), the workers' summed RSS and threads. Keeps the peaks."""

    def __init__(self, url: str, pids: list[int], model_stats: str) -> None:
        self.engine = bench_engine(url)
        self.name, self.pids = db_name(url), pids
        self.model_stats = model_stats
        self.open_calls: list[tuple[float, int]] = []  # (when, model calls open at the model)
        self.peak_conns = self.peak_active = self.peak_threads = 0
        self.peak_rss = 0.0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)
        self._t.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            with contextlib.suppress(httpx.HTTPError, ValueError):
                opened = httpx.get(self.model_stats, timeout=2).json()["in_flight"]
                self.open_calls.append((time.time(), int(opened)))
            rss = sum(proc_rss_mb(p) for p in self.pids)
            self.peak_rss = max(self.peak_rss, rss)
            self.peak_threads = max(self.peak_threads, sum(threads_of(p) for p in self.pids))
            with contextlib.suppress(sa.exc.DBAPIError):  # a restart: the next sample
                total, active = self._connections()
                self.peak_conns = max(self.peak_conns, total)
                self.peak_active = max(self.peak_active, active)

    def _connections(self) -> tuple[int, int]:
        """The workers' connections to the scratch database: all, and the active ones."""
        with self.engine.connect() as conn:
            total, active = conn.execute(
                sa.text(
                    "SELECT count(*), count(*) FILTER (WHERE state = 'active')"
                    " FROM pg_stat_activity WHERE datname = :d"
                    " AND application_name NOT IN (:app, :own)"
                    " AND backend_type = 'client backend'"
                ),
                {"d": self.name, "app": BENCH_APP, "own": f"treadle/{os.getpid()}"},
            ).one()
        return int(total), int(active)

    def close(self) -> None:
        self._stop.set()
        self._t.join(2)
        self.engine.dispose()


def snapshot(admin: sa.Engine, url: str, pids: list[int], outside: list[int]) -> dict[str, Any]:
    """CPU so far: the workers (``pids``), the fake model and tool endpoint (``outside``), this
    bench, PostgreSQL's backends and the whole machine."""

    def backends() -> dict[int, float]:
        with admin.connect() as conn:
            return pg_backend_cpu(conn, db_name(url))

    return {
        "t": time.time(),
        "machine": machine_cpu()[0],
        "workers": sum(proc_cpu(p) for p in pids),
        "outside": sum(proc_cpu(p) for p in outside),
        "bench": proc_cpu(os.getpid()),
        "pg": retrying(backends),
    }


def rounds_between(admin: sa.Engine, a: float, b: float) -> int:
    with admin.connect() as conn:
        return int(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM usage WHERE purpose = 'round'"
                    " AND created_at >= :a AND created_at < :b"
                ),
                {"a": a, "b": b},
            ).scalar_one()
        )


def first_wave_s(admin: sa.Engine) -> float:
    """From the first to the last commit of the runs' first model call (s): the width of a wave."""
    with admin.connect() as conn:
        a, b = conn.execute(
            sa.text("SELECT min(created_at), max(created_at) FROM usage WHERE round = 1")
        ).one()
    return 0.0 if a is None else float(b) - float(a)


def first_round_at(admin: sa.Engine) -> float | None:
    with admin.connect() as conn:
        t = conn.execute(sa.text("SELECT min(created_at) FROM usage")).scalar_one()
    return None if t is None else float(t)


def gaps(admin: sa.Engine) -> list[float]:
    """Per run, from one model call's end to the next one's start (seconds): the engine's
    round around the tool (commit, tool claim/commit, join, next round's claim)."""
    with admin.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT run_id, created_at, coalesce(latency_ms, 0) FROM usage"
                " WHERE purpose = 'round' ORDER BY run_id, round"
            )
        ).all()
    out: list[float] = []
    for prev, cur in zip(rows, rows[1:], strict=False):
        if prev[0] == cur[0]:
            out.append(float(cur[1]) - cur[2] / 1000 - float(prev[1]))
    return out


def workers_up(app: Any, names: list[str], timeout: float = 60) -> None:
    """Every worker answers a ping: its consumers are up (a paced start must not queue)."""
    nodes = {f"{n}@{socket.gethostname()}" for n in names}

    def answered() -> bool:
        replies = app.control.ping(destination=sorted(nodes), timeout=1.0) or []
        return nodes <= {k for r in replies for k in r}

    wait_for(answered, timeout, "the workers' ping", 0.5)


def paced(rt: Any, agent: dict[str, Any], runs: int, over: float) -> float:
    """Submit ``runs`` runs evenly over ``over`` seconds (4 submitters); returns when the last
    one is in."""
    t0 = time.time()

    def lane(k: int) -> None:
        for i in range(k, runs, 4):
            time.sleep(max(0.0, t0 + i * over / runs - time.time()))
            submit(rt, agent)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lane, range(4)))
    return time.time()


def measure(procs: Procs, url: str, runs: int, start: str) -> dict[str, Any]:
    """``start``: ``spread`` — the workers run, then the runs arrive evenly over one latency
    (the steady state of runs that started at different times); ``burst`` — every run is
    queued before the workers start (their rounds come back in waves, one latency apart)."""
    conc = concurrency(runs)
    ideal = runs / LATENCY
    prefix = new_prefix(f"if{runs}")
    admin = bench_engine(url)
    names: list[str] = []
    outside: Outside | None = None
    sampler: Sampler | None = None
    out: dict[str, Any] = {"runs": runs, "conc": conc, "ideal": ideal, "start": start}
    try:
        with admin.begin() as conn:  # a fresh count for this size
            for table in ("usage", "events", "messages", "tool_calls", "outbox", "runs"):
                conn.execute(sa.text(f"DELETE FROM {table}"))
        rt = treadle_runtime(url, prefix, pool_size=4)
        outside = Outside(procs, latency=LATENCY, text_chars=len(TEXT))
        agent = outside.agent(ROUNDS)
        env = treadle_env(url, prefix)  # defaults but `-c`
        if start == "burst":
            t = time.time()
            with ThreadPoolExecutor(4) as pool:
                list(pool.map(lambda _: submit(rt, agent), range(runs)))
            log(f"inflight: {runs} runs queued in {time.time() - t:.0f} s; starting workers")
        names = start_treadle_workers(procs, env, PROCS, conc, tag=f"if{runs}-")
        pids = [procs.pid(n) for n in names]
        sampler = Sampler(url, pids, f"http://127.0.0.1:{outside.model_port}/stats")
        started = time.time()
        if start == "burst":
            t0 = wait_for(lambda: first_round_at(admin), LATENCY + 120, "the first round", 0.2)
            out["first_round_s"] = t0 - started
            a_t = t0 - EDGE  # whole waves: the first one from its first commit
        else:
            workers_up(rt.publish.app, names)
            started = time.time()
            a_t = paced(rt, agent, runs, LATENCY) + LATENCY / 2
            log(f"inflight: {runs} runs submitted over {time.time() - started:.1f} s")
            out["first_round_s"] = (first_round_at(admin) or started) - started
        close_runtime(rt)
        b_t = a_t + WINDOW
        time.sleep(max(0.0, a_t - time.time()))
        a = snapshot(admin, url, pids, outside.pids())
        time.sleep(max(0.0, b_t - time.time()))
        b = snapshot(admin, url, pids, outside.pids())
        time.sleep(2)  # commits of the window's last rounds
        n = rounds_between(admin, a_t, b_t)  # the CPU snapshots are taken at (about) these
        out.update(rate=n / (b_t - a_t), rounds=n, window=b_t - a_t)
        k = max(n, 1)
        out.update(
            cpu=(b["workers"] - a["workers"]) / k,
            machine=(b["machine"] - a["machine"]) / k,
            pg=pg_cpu_delta(a["pg"], b["pg"]) / k,
            outside=(b["outside"] - a["outside"]) / k,
            bench=(b["bench"] - a["bench"]) / k,
            open_calls=[n for t, n in sampler.open_calls if a_t <= t <= b_t],
            worker_cores=(b["workers"] - a["workers"]) / (b["t"] - a["t"]),
            machine_cores=(b["machine"] - a["machine"]) / (b["t"] - a["t"]),
        )
        log(f"inflight: {runs} runs, {start}: {out['rate']:.1f} rounds/s; waiting for the end")
        done = ("completed", "failed", "cancelled")
        try:
            wait_for(
                lambda: count_status(admin, done) >= runs,
                ROUNDS * LATENCY * 4 + 120,
                f"{runs} runs to end",
                interval=1.0,
            )
        except TimeoutError as exc:
            out["timeout"] = str(exc)
        out["ended_s"] = time.time() - started
        out["finished"] = count_status(admin, done)
        out["failed"] = count_status(admin, ["failed"])
        out["fails"] = failed_runs(admin)
        out["gaps"] = gaps(admin)
        out["wave_s"] = first_wave_s(admin)
    finally:
        if sampler is not None:
            sampler.close()
            out.update(
                peak_conns=sampler.peak_conns,
                peak_active=sampler.peak_active,
                peak_rss=sampler.peak_rss,
                peak_threads=sampler.peak_threads,
            )
        for name in names:
            procs.stop(name)
        if outside is not None:
            outside.close()
        admin.dispose()
        redis_cleanup(prefix)
    return out


def main() -> None:
    started = time.time()
    procs = Procs()
    results: list[dict[str, Any]] = []
    errors: list[str] = []
    with scratch_db("inflight") as url:
        try:
            for runs in SIZES:
                for start in STARTS:
                    log(f"inflight: {runs} runs, {start}, {PROCS} x {concurrency(runs)} threads")
                    try:
                        results.append(measure(procs, url, runs, start))
                    except Exception as exc:  # e.g. PostgreSQL restarted by a chaos test
                        log(f"inflight: {runs} runs failed: {exc!r}")
                        first = str(exc).splitlines()[0] if str(exc) else ""
                        errors.append(f"{runs} runs, {start}: {type(exc).__name__}: {first}"[:200])
        finally:
            procs.stop_all()
    s = Section(
        f"Runs in flight: model latency {LATENCY:.0f} s, {ROUNDS} tool rounds per run, "
        f"{PROCS} worker processes `-P threads`, HTTP model + one HTTP tool, defaults but `-c`"
        + opt_in_label(),
        [
            "measure",
            *[f"{r['runs']} runs, {r['start']} start" for r in results],
            "target",
            "verdict",
        ],
    )

    def row(label: str, cells: list[str], target: str = "", ok: list[bool] | None = None) -> None:
        v = "" if ok is None else " / ".join(verdict(x) for x in ok)
        s.row(label, *cells, target, v)

    row("threads per worker process (`-c`)", [str(r["conc"]) for r in results])
    row("ideal rounds/s (runs / latency)", [num(r["ideal"], 0) for r in results])
    row(
        "**rounds/s in the window**",
        [f"**{num(r['rate'], 1)}** = {r['rate'] / r['ideal']:.0%}" for r in results],
        f">= {TARGET:.0%} of ideal",
        [r["rate"] >= TARGET * r["ideal"] for r in results],
    )
    row(
        "**model calls open at the model in the window**, mean / peak (sampled every 0.5 s)",
        [
            f"**{num(statistics.fmean(c), 0)}** / {max(c)}"
            for c in (r["open_calls"] or [0] for r in results)
        ],
        f"the ideal: {', '.join(str(r['runs']) for r in results)}",
    )
    row(
        "gap between a run's model calls, median / p95 (s)",
        [f"{num(med(r['gaps']), 2)} / {num(p95(r['gaps']), 2)}" for r in results],
    )
    row(
        "first model calls committed over (s: the width of a wave)",
        [num(r["wave_s"], 1) for r in results],
    )
    row(
        "first round committed, after the workers' start (s)",
        [num(r["first_round_s"], 1) for r in results],
    )
    row(
        "all runs ended, after the workers' start (s; ideal ≈ rounds x latency)",
        [f"{num(r['ended_s'], 0)} ({r['finished']} ended, {r['failed']} failed)" for r in results],
    )
    row(
        "**workers' total RSS, peak (MB)**",
        [f"**{num(r['peak_rss'], 0)}**" for r in results],
        f"<= {RSS_LIMIT_MB:.0f}",
        [r["peak_rss"] <= RSS_LIMIT_MB for r in results],
    )
    row("workers' threads, peak (all processes)", [str(r["peak_threads"]) for r in results])
    row(
        "**PostgreSQL connections of the workers, peak** (active at once)",
        [f"**{r['peak_conns']}** ({r['peak_active']})" for r in results],
        f"<= {CONN_LIMIT}",
        [r["peak_conns"] <= CONN_LIMIT for r in results],
    )
    row("worker CPU per round (ms)", [num(r["cpu"] * 1000, 1) for r in results])
    row("PostgreSQL backends' CPU per round (ms)", [num(r["pg"] * 1000, 1) for r in results])
    row(
        "fake model + tool endpoint processes' CPU per round (ms) / this bench process's",
        [f"{num(r['outside'] * 1000, 1)} / {num(r['bench'] * 1000, 1)}" for r in results],
    )
    row("whole machine CPU per round (ms)", [num(r["machine"] * 1000, 1) for r in results])
    row(
        "cores busy in the window: workers / whole machine (of 2)",
        [f"{num(r['worker_cores'], 2)} / {num(r['machine_cores'], 2)}" for r in results],
    )
    s.note(
        f"Rounds/s = model calls committed in a {WINDOW:g} s window. Spread start: the runs "
        f"arrive evenly over {LATENCY:g} s while the workers run; the window opens "
        f"{LATENCY / 2:g} s after the last one. Burst start: all runs are queued before the "
        f"workers start; the window opens {EDGE:g} s before the first round's commit, so it "
        f"holds whole waves (the replies come back in waves one latency apart, as wide as the "
        "first model calls' spread, which can exceed half a latency). "
        "Gap = next model call's start − previous round's commit, per run (the tool round, the "
        "claims and the engine gate's line between two model calls; the ideal is 0). "
        "Connections: pg_stat_activity rows on the scratch database other than the bench's own, "
        "sampled "
        "every 0.5 s; the workers' pools are the default size. RSS and threads: "
        "/proc of the worker processes, sampled every 0.5 s. CPU per round: utime+stime in "
        "the window / rounds in it; with 2 cores the machine cannot exceed 2,000 ms of CPU "
        "per second, so 2,000 / (whole-machine ms per round) is the CPU-bound ceiling in "
        "rounds/s — other sessions' test suites share these cores."
    )
    for e in errors:
        s.note(f"**not measured**: {e}")
    for r in results:
        if r.get("timeout"):
            s.note(f"{r['runs']} runs: {r['timeout']}")
        if r["fails"]:
            s.note(f"{r['runs']} runs: failed runs, e.g. {r['fails'][:2]}")
    head = [
        [
            f"{r['runs']} runs in flight ({r['start']} start), model {LATENCY:.0f} s, "
            f"{PROCS} x {r['conc']} threads",
            f"{r['rate']:.1f} rounds/s = {r['rate'] / r['ideal']:.0%} of ideal "
            f"{r['ideal']:.0f}; RSS {r['peak_rss']:.0f} MB; {r['peak_conns']} PG connections; "
            f"worker CPU {r['cpu'] * 1000:.0f} ms/round",
            f">= {TARGET:.0%}, <= {RSS_LIMIT_MB:.0f} MB, <= {CONN_LIMIT}",
            verdict(
                r["rate"] >= TARGET * r["ideal"]
                and r["peak_rss"] <= RSS_LIMIT_MB
                and r["peak_conns"] <= CONN_LIMIT
            ),
        ]
        for r in results
    ]
    text = emit("inflight", "Runs in flight", [s], started, head)
    m = machine()
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load = os.getloadavg()
    OUT.write_text(
        f"# Runs in flight — {when}\n\n{m['cores']} cores ({m['cpu']}), {m['memory']} RAM, "
        f"Python {m['python']}; load average (1 min) at the end {load[0]:.1f} (other sessions "
        "share the machine). Command: `BENCH_INFLIGHT_RUNS="
        + ",".join(str(x) for x in SIZES)
        + f" BENCH_INFLIGHT_LATENCY={LATENCY:g} BENCH_INFLIGHT_START={','.join(STARTS)}"
        + " python -m bench.inflight`.\n\n"
        + text.split("\n", 2)[2],
        encoding="utf-8",
    )


if __name__ == "__main__":
    main()
