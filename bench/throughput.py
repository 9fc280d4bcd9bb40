"""Throughput on the path users run: concurrent tool-agent runs (the fake model in its own
process, streamed SSE over HTTP, answering after the latency; one inline read-only HTTP tool
per round against an endpoint in another process; defaults but `-c`), model latency 200 ms,
with 1, 2 and 3 worker processes of the threads pool. Rounds/s against the ideal (concurrency /
latency) and against the floor doing the same work shape (500 chains, each "round" a hop that
sleeps 200 ms then one SQL transaction, plus a hop that only does the transaction — the tool);
CPU per round of the workers, of PostgreSQL's backends and of the whole machine.

The fake model's and the tool endpoint's CPU is on this machine too (and counted in the
whole-machine column); the floor pays none of it.

    python -m bench.throughput   (BENCH_TP_RUNS=500, BENCH_TP_ROUNDS=8, BENCH_TP_PROCS=1,2,3,
                                  BENCH_TP_CONCURRENCY=64, BENCH_TP_LATENCY=0.2,
                                  BENCH_TP_RAMP=4, BENCH_TP_WINDOW=15)
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import sqlalchemy as sa

from bench.common import (
    TEXT_500,
    Floor,
    Outside,
    Procs,
    Section,
    close_runtime,
    count_status,
    db_name,
    emit,
    failed_runs,
    log,
    machine_cpu,
    new_prefix,
    num,
    opted_in,
    path_name,
    pg_backend_cpu,
    pg_cpu_delta,
    proc_cpu,
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
from shared.config import Settings
from shared.store.db import default_pool_size

RUNS = int(os.environ.get("BENCH_TP_RUNS", "500"))
ROUNDS = int(os.environ.get("BENCH_TP_ROUNDS", "8"))
RAMP = float(os.environ.get("BENCH_TP_RAMP", "4"))
WINDOW = float(os.environ.get("BENCH_TP_WINDOW", "15"))
TEXT = TEXT_500[:200]
PROCS = [int(x) for x in os.environ.get("BENCH_TP_PROCS", "1,2,3").split(",")]
CONC = int(os.environ.get("BENCH_TP_CONCURRENCY", "64"))
LATENCY = float(os.environ.get("BENCH_TP_LATENCY", "0.2"))
TARGET = 0.8


class ConnSampler:
    """The peak number of PostgreSQL connections to one database, sampled every 0.5 s."""

    def __init__(self, url: str) -> None:
        self.engine = sa.create_engine(url, pool_size=1, max_overflow=0)
        self.name = db_name(url)
        self.peak = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)
        self._t.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            try:
                with self.engine.connect() as conn:
                    n = conn.execute(
                        sa.text("SELECT count(*) FROM pg_stat_activity WHERE datname = :d"),
                        {"d": self.name},
                    ).scalar_one()
                self.peak = max(self.peak, int(n))
            except Exception:
                pass

    def close(self) -> int:
        self._stop.set()
        self._t.join(2)
        self.engine.dispose()
        return self.peak


def snapshot(admin: sa.Engine, url: str, pids: list[int]) -> dict[str, Any]:
    pg = retrying(_backend_cpu, admin, url)
    return {
        "t": time.time(),
        "machine": machine_cpu()[0],
        "workers": sum(proc_cpu(p) for p in pids),
        "pg": pg,
    }


def _backend_cpu(admin: sa.Engine, url: str) -> dict[int, float]:
    with admin.connect() as conn:
        return pg_backend_cpu(conn, db_name(url))


def per_round(a: dict[str, Any], b: dict[str, Any], rounds: int) -> dict[str, float]:
    n = max(rounds, 1)
    return {
        "cpu": (b["workers"] - a["workers"]) / n,
        "machine": (b["machine"] - a["machine"]) / n,
        "pg": pg_cpu_delta(a["pg"], b["pg"]) / n,
    }


def measure(procs: Procs, url: str, n_procs: int) -> dict[str, Any]:
    """The floor, then treadle, with ``n_procs`` worker processes of ``CONC`` threads, each
    over a fixed window once the work is flowing."""
    admin = sa.create_engine(url, pool_size=2)
    out: dict[str, Any] = {"procs": n_procs, "ideal": n_procs * CONC / LATENCY}
    # -- floor: 500 chains; a round = a hop sleeping the model latency + a hop (the tool)
    fprefix = new_prefix(f"tpf{n_procs}")
    floor = Floor(procs, url, fprefix, workers=n_procs, concurrency=CONC)
    try:
        ids = floor.launch(RUNS, 2 * 50, sleep_even=LATENCY)
        time.sleep(RAMP)
        a = snapshot(admin, url, floor.pids())
        time.sleep(WINDOW)
        b = snapshot(admin, url, floor.pids())
        n = rounds_started(floor, ids, a["t"], b["t"], "hop % 2 = 0")
        out["floor_rate"] = n / (b["t"] - a["t"])
        out["floor"] = per_round(a, b, n)
    finally:
        floor.close()
        redis_cleanup(fprefix)
    # -- the protocol, bare: the same chains making a tool round's round trips, no engine
    out["bare"] = _bare(procs, url, admin, n_procs)
    # -- treadle: the runs are queued first, then the workers start
    prefix = new_prefix(f"tp{n_procs}")
    rt = treadle_runtime(url, prefix, pool_size=4)
    names: list[str] = []
    outside: Outside | None = None
    sampler = ConnSampler(url)
    try:
        with admin.begin() as conn:  # a fresh count for this configuration
            for table in ("usage", "events", "messages", "tool_calls", "outbox", "runs"):
                conn.execute(sa.text(f"DELETE FROM {table}"))
        outside = Outside(procs, latency=LATENCY, text_chars=len(TEXT))
        agent = outside.agent(ROUNDS)
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda _: submit(rt, agent), range(RUNS)))
        env = treadle_env(url, prefix)  # defaults: the pool follows `-c`
        names = start_treadle_workers(procs, env, n_procs, CONC, tag=f"tp{n_procs}-")
        pids = [procs.pid(n) for n in names]
        wait_for(lambda: count_usage(admin) > 0, 120, "the first round")
        time.sleep(RAMP)
        a = snapshot(admin, url, pids)
        time.sleep(WINDOW)
        b = snapshot(admin, url, pids)
        with admin.connect() as conn:
            n = int(
                conn.execute(
                    sa.text(
                        "SELECT count(*) FROM usage WHERE purpose = 'round'"
                        " AND created_at BETWEEN :a AND :b"
                    ),
                    {"a": a["t"], "b": b["t"]},
                ).scalar_one()
            )
            finished = int(
                conn.execute(
                    sa.text("SELECT count(*) FROM runs WHERE status IN ('completed', 'failed')")
                ).scalar_one()
            )
        out.update(
            rate=n / (b["t"] - a["t"]),
            rounds=n,
            finished=finished,
            failed=count_status(rt.engine, ["failed"]),
            fails=failed_runs(rt.engine),
            **per_round(a, b, n),
        )
    finally:
        out["peak_conns"] = sampler.close()
        for name in names:
            procs.stop(name)
        if outside is not None:
            outside.close()
        close_runtime(rt)
        admin.dispose()
        redis_cleanup(prefix)
    return out


def _bare(procs: Procs, url: str, admin: sa.Engine, n_procs: int) -> dict[str, float]:
    """``RUNS`` chains of the round protocol, bare (``bench.floorapp.bare_round``: claim, HTTP
    model call, commit; read, claim, HTTP tool call, commit), on the floor's workers with the
    same model and tool processes treadle gets: rounds/s and CPU per round in the window."""
    fprefix = new_prefix(f"tpb{n_procs}")
    pool = default_pool_size(CONC, Settings().worker_engine_slots)  # as treadle's, and overflow
    floor = Floor(procs, url, fprefix, workers=n_procs, concurrency=CONC, pool=pool)
    outside: Outside | None = None
    try:
        outside = Outside(procs, latency=LATENCY, text_chars=len(TEXT))
        urls = [outside.model_url, outside.tool_url]
        ids = floor.launch_bare(RUNS, ROUNDS, urls, chars=len(TEXT))
        time.sleep(RAMP)
        a = snapshot(admin, url, floor.pids())
        time.sleep(WINDOW)
        b = snapshot(admin, url, floor.pids())
        n = rounds_started(floor, ids, a["t"], b["t"])
        return {"rate": n / (b["t"] - a["t"]), **per_round(a, b, n)}
    finally:
        if outside is not None:
            outside.close()
        floor.close()
        redis_cleanup(fprefix)


def rounds_started(floor: Floor, ids: list[int], a: float, b: float, where: str = "true") -> int:
    """Rows of ``floor_log`` whose round started in the window [a, b] (chains ``ids``). A row
    is written when its round commits, after the model latency: it is counted once every
    round started in the window has had time to commit."""
    time.sleep(LATENCY + 0.5)
    with floor.engine.connect() as conn:
        return int(
            conn.execute(
                sa.text(
                    f"SELECT count(*) FROM floor_log WHERE {where}"
                    " AND chain BETWEEN :lo AND :hi AND started_at BETWEEN :a AND :b"
                ),
                {"lo": ids[0], "hi": ids[-1], "a": a, "b": b},
            ).scalar_one()
        )


def pg_started(url: str) -> str:
    eng = sa.create_engine(url, pool_size=1)
    try:
        return str(retrying(_postmaster_start, eng))
    finally:
        eng.dispose()


def _postmaster_start(eng: sa.Engine) -> Any:
    with eng.connect() as conn:
        return conn.execute(sa.text("SELECT pg_postmaster_start_time()")).scalar_one()


def count_usage(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM usage")).scalar_one())


def main() -> None:
    started = time.time()
    procs = Procs()
    results = []
    errors: list[str] = []
    with scratch_db("throughput") as url:
        try:
            for n in PROCS:
                for attempt in (1, 2):  # once more if PostgreSQL restarted meanwhile
                    log(f"throughput: {n} worker process(es) x {CONC} threads")
                    started_pg = pg_started(url)
                    try:
                        r = measure(procs, url, n)
                    except Exception as exc:  # e.g. PostgreSQL restarted by a chaos test
                        log(f"throughput: {n} processes failed: {exc!r}")
                        if attempt == 2:
                            first = str(exc).splitlines()[0] if str(exc) else ""
                            errors.append(f"{n} processes: {type(exc).__name__}: {first}"[:200])
                        continue
                    if pg_started(url) == started_pg or attempt == 2:
                        results.append(r)
                        break
                    log("throughput: PostgreSQL restarted during the measurement; again")
        finally:
            procs.stop_all()
    s = Section(
        f"Throughput, {path_name()}: {RUNS} concurrent runs x {ROUNDS} rounds, HTTP "
        f"model (latency {LATENCY * 1000:.0f} ms) + one HTTP tool per round, "
        f"`-P threads -c {CONC}` per process, defaults{' but the opt-in' if opted_in() else ''}",
        [
            "worker processes",
            "ideal rounds/s",
            "floor rounds/s",
            "**treadle rounds/s**",
            "of ideal",
            "**treadle / floor**",
            "target",
            "verdict",
            "the protocol, bare (NOT treadle): rounds/s, of the floor",
        ],
    )
    for r in results:
        s.row(
            r["procs"],
            num(r["ideal"], 0),
            num(r["floor_rate"], 1),
            f"**{num(r['rate'], 1)}**",
            f"{r['rate'] / r['ideal']:.0%}",
            f"**{r['rate'] / r['floor_rate']:.0%}**",
            f">= {TARGET:.0%} of the floor",
            verdict(r["rate"] >= TARGET * r["floor_rate"]),
            f"{num(r['bare']['rate'], 1)}, {r['bare']['rate'] / r['floor_rate']:.0%}",
        )
    s.note(
        "Ideal = processes x threads / model latency (every thread always in a model call). "
        f"Rounds/s = model calls started in a {WINDOW:.0f} s window that opens {RAMP:.0f} s "
        f"after the first round: the {RUNS} runs ({ROUNDS} rounds each, 200-char tool "
        "arguments) are all queued before the workers start, and are far from done when "
        "the window closes. The floor does the same shape with raw Celery: a hop that "
        "sleeps the model latency then commits one SQL transaction, and a hop that only "
        "commits one (the tool), per round, same processes and threads, same window. "
        "The protocol, bare (`bench/floorapp.py` `bare_round`, `bare_tool`; NOT treadle) "
        "is the same number of chains on the floor's workers making a tool round's round "
        "trips with no engine: claim, the HTTP model call (the same fake model process and "
        "latency), commit; read, the HTTP tool call beside its claim, commit; same window. "
        "Rounds of both the floor and the bare chains are counted once those started in the "
        "window have committed. It is "
        "what this shape costs on this machine before any of treadle's own work: the fake "
        "model's and the tool endpoint's CPU is on these 2 cores, as for treadle."
    )
    sections = [s]
    c = Section(
        "CPU per round (milliseconds of CPU time)",
        [
            "worker processes",
            "treadle workers",
            "treadle PostgreSQL backends",
            "treadle whole machine",
            "floor workers",
            "floor whole machine",
            "the protocol, bare (NOT treadle): workers / whole machine",
            "peak PG connections (treadle)",
            "failed runs",
        ],
    )
    for r in results:
        c.row(
            r["procs"],
            num(r["cpu"] * 1000, 2),
            num(r["pg"] * 1000, 2),
            num(r["machine"] * 1000, 2),
            num(r["floor"]["cpu"] * 1000, 2),
            num(r["floor"]["machine"] * 1000, 2),
            f"{num(r['bare']['cpu'] * 1000, 2)} / {num(r['bare']['machine'] * 1000, 2)}",
            r["peak_conns"],
            r["failed"],
        )
    c.note(
        "Workers: utime+stime of the worker processes in the window / rounds in it. "
        "PostgreSQL: the backends connected to the bench database. Whole machine: all busy "
        "CPU time of the 2 cores (other processes included) / rounds: with 2 cores the "
        "machine cannot exceed 2000 ms of CPU per second, so 2000 / (machine ms per round) "
        "is the CPU-bound ceiling in rounds/s."
    )
    c.note(
        "Workers run with the defaults a user gets (only `-c` and the process count set): "
        "admission, engine gate, model-client and database pools as shipped."
    )
    for e in errors:
        c.note(f"**not measured**: {e}")
    for r in results:
        if r["fails"]:
            c.note(f"{r['procs']} processes: failed runs, e.g. {r['fails'][:2]}")
    sections.append(c)
    head = [
        [
            f"rounds/s, {r['procs']} x {CONC} threads (ideal {r['ideal']:.0f})",
            f"{r['rate']:.1f} = {r['rate'] / r['floor_rate']:.0%} of the floor's "
            f"{r['floor_rate']:.0f} ({r['rate'] / r['ideal']:.0%} of ideal); worker CPU "
            f"{r['cpu'] * 1000:.1f} ms/round (floor {r['floor']['cpu'] * 1000:.1f}); the "
            f"protocol, bare (NOT treadle): {r['bare']['rate'] / r['floor_rate']:.0%}",
            f">= {TARGET:.0%} of the floor",
            verdict(r["rate"] >= TARGET * r["floor_rate"]),
        ]
        for r in results
    ]
    emit("throughput", "Throughput vs the floor", sections, started, head)


if __name__ == "__main__":
    main()
