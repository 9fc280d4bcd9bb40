"""Tool rounds against the floor, on the path users run: a tool agent whose model is the fake
OpenAI-compatible server in its own process (streamed SSE over HTTP, no latency) and whose one
tool is an inline read-only HTTP tool posting to an endpoint in another process (one call per
round, ~500-char assistant and tool messages), on Redis + PostgreSQL through a real worker
process with the defaults (every round its own Celery task). A labelled quick-tool row (the
in-process ``quick`` ``bench_echo``, NOT the path users run) is measured in the same blocks.
Per-round overhead (a round's wall time minus its
model call) against the floor hop measured in the same run, interleaved; where the time of a
round goes; the Redis commands of a round; and, driving the same engine in this process, the
statements, transactions and bytes written at rounds 1, 10, 25, 50 and 200.

    python -m bench.rounds     (BENCH_ROUNDS=50, BENCH_ROUNDS_RUNS=3, BENCH_ROUNDS_LONG=200)
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import sqlalchemy as sa

from bench.common import (
    REDIS_URL,
    Floor,
    FloorResult,
    Outside,
    Probe,
    Procs,
    Section,
    close_runtime,
    emit,
    http_model_quick_tool_agent,
    log,
    med,
    merge,
    ms,
    new_prefix,
    num,
    opt_in_label,
    opted_in,
    p95,
    path_name,
    quick_tool_responder,
    reads_in_round,
    redis_cleanup,
    scratch_db,
    start_treadle_workers,
    submit,
    treadle_env,
    treadle_runtime,
    verdict,
    wait_for,
    wal_lsn,
)
from shared.llm.fake_server import FakeLLMServer

ROUNDS = int(os.environ.get("BENCH_ROUNDS", "50"))
RUNS = int(os.environ.get("BENCH_ROUNDS_RUNS", "3"))
LONG = int(os.environ.get("BENCH_ROUNDS_LONG", "200"))
FLOOR_HOPS = int(os.environ.get("BENCH_ROUNDS_FLOOR_HOPS", "100"))
AT = [k for k in (1, 10, 25, 50, 200) if k <= LONG]
TARGET_HOPS = 2.5


def run_and_wait(rt: Any, agent: dict[str, Any], timeout: float = 300) -> str:
    run_id = submit(rt, agent)

    def done() -> bool:
        with rt.engine.connect() as conn:
            status = conn.execute(
                sa.text("SELECT status FROM runs WHERE id = :r"), {"r": run_id}
            ).scalar_one()
        if status == "failed":
            raise RuntimeError(f"run {run_id} failed")
        return bool(status == "completed")

    wait_for(done, timeout, f"run {run_id}", interval=0.02)
    return run_id


# --------------------------------------------------------------------------- timings


def round_phases(engine: sa.Engine, run_id: str) -> list[dict[str, float]]:
    """Per tool round k: its cycle (round k claimed → round k+1 claimed), the model call, and
    the phases between the durable timestamps the engine writes."""
    with engine.connect() as conn:
        evs = conn.execute(
            sa.text("SELECT type, created_at, data FROM events WHERE run_id = :r ORDER BY seq"),
            {"r": run_id},
        ).all()
        msg = dict(
            conn.execute(
                sa.text(
                    "SELECT round, created_at FROM messages"
                    " WHERE run_id = :r AND role = 'assistant'"
                ),
                {"r": run_id},
            ).all()
        )
        model = dict(
            conn.execute(
                sa.text(
                    "SELECT round, latency_ms FROM usage WHERE run_id = :r AND purpose = 'round'"
                ),
                {"r": run_id},
            ).all()
        )
    started: dict[int, float] = {}
    tool_start: dict[int, float] = {}
    tool_end: dict[int, float] = {}
    k = 0
    for type_, ts, data in evs:
        if type_ == "round.started":
            k = int(data["round"])
            started[k] = ts
        elif type_ == "tool.started":
            tool_start.setdefault(k, ts)
        elif type_ == "tool.finished":
            tool_end[k] = ts
    out = []
    for k in sorted(started):
        if k + 1 not in started or k not in tool_end or k not in msg:
            continue
        m = (model.get(k) or 0) / 1000
        cycle = started[k + 1] - started[k]
        out.append(
            {
                "round": k,
                "cycle": cycle,
                "model": m,
                "overhead": cycle - m,
                "claim_model": msg[k] - started[k] - m,
                "commit_to_tool": tool_start[k] - msg[k],
                "tool": tool_end[k] - tool_start[k],
                "tool_commit_to_round": started[k + 1] - tool_end[k],
            }
        )
    return out


def window(rows: list[dict[str, float]], k: int, key: str, span: int = 2) -> list[float]:
    return [r[key] for r in rows if abs(r["round"] - k) <= span]


# --------------------------------------------------------------------------- Redis commands


def redis_commands(
    rt: Any, make_agent: Callable[[int], dict[str, Any]], rounds: int
) -> tuple[Counter[str], int]:
    """Commands on our Redis DB during one run of ``rounds`` tool rounds (MONITOR)."""
    db = REDIS_URL.rsplit("/", 1)[-1] or "0"
    hostport = REDIS_URL.split("//", 1)[1].split("/", 1)[0]
    host, _, port = hostport.rpartition(":")
    out = open(os.devnull, "wb")  # noqa: SIM115
    mon = subprocess.Popen(
        ["redis-cli", "-h", host or "127.0.0.1", "-p", port or "6379", "monitor"],
        stdout=subprocess.PIPE,
        stderr=out,
    )
    lines: list[bytes] = []
    reader = threading.Thread(
        target=lambda: lines.extend(iter(mon.stdout.readline, b"")), daemon=True
    )  # type: ignore[union-attr]
    reader.start()
    time.sleep(0.3)
    run_and_wait(rt, make_agent(rounds))
    time.sleep(0.3)
    mon.terminate()
    mon.wait(5)
    reader.join(5)
    counts: Counter[str] = Counter()
    for raw in lines:
        line = raw.decode(errors="replace")
        if f"[{db} " not in line:
            continue
        parts = line.split('"')
        if len(parts) > 1:
            counts[parts[1].upper()] += 1
    return counts, rounds


# --------------------------------------------------------------------------- in-process


@contextmanager
def client_cpu() -> Iterator[list[float]]:
    """This thread's CPU time inside the model client's ``complete()``, summed into the
    yielded cell while the block runs (the request carries the whole history: what the
    engine's own CPU excludes)."""
    from shared.llm.openai_compat import OpenAICompatModel

    spent = [0.0]
    real_complete = OpenAICompatModel.complete

    def timed_complete(self: Any, *args: Any, **kw: Any) -> Any:
        c = time.thread_time()
        try:
            return real_complete(self, *args, **kw)
        finally:
            spent[0] += time.thread_time() - c

    OpenAICompatModel.complete = timed_complete  # type: ignore[method-assign]
    try:
        yield spent
    finally:
        OpenAICompatModel.complete = real_complete  # type: ignore[method-assign]


def anatomy(
    url: str,
    prefix: str,
    make_agent: Callable[[int], dict[str, Any]],
    rounds: int,
    repeats: int = 1,
) -> dict[int, dict[str, Any]]:
    """Drive tool runs with the engine's own functions in this process (no broker: a list),
    snapshotting the WAL position, the statements and the rows at each round boundary."""
    import json5

    from shared.engine.livebus import InProcessBus
    from shared.engine.round import run_round
    from shared.engine.toolrun import run_tool

    rt = treadle_runtime(url, prefix)
    queue: deque[Any] = deque()
    published = Counter[str]()

    def publish(items: list[Any]) -> None:
        queue.extend(items)
        published["broker messages"] += len(items)

    bus = InProcessBus()
    orig_live = bus.publish

    def live(run_id: str, event: dict[str, Any]) -> None:
        published["live publishes (Redis PUBLISH in a worker)"] += 1
        orig_live(run_id, event)

    bus.publish = live  # type: ignore[method-assign]
    rt = replace(rt, publish=publish, live=bus)
    probe = Probe().attach(rt.engine)
    PREPING[0] = (
        "each one a `SELECT 1` round trip: `pool_pre_ping` is on"
        if getattr(rt.engine.pool, "_pre_ping", False)
        else "`pool_pre_ping` is off: no extra round trip"
    )
    spawned = Counter[str]()
    real_start = threading.Thread.start

    def counting_start(self: threading.Thread) -> None:
        spawned[self.name.split("-")[0]] += 1
        real_start(self)

    json5_s = [0.0]
    real_json5 = json5.loads

    def timed_json5(*args: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        try:
            return real_json5(*args, **kw)
        finally:
            json5_s[0] += time.perf_counter() - t

    lsn_engine = sa.create_engine(url, isolation_level="AUTOCOMMIT", pool_size=1)
    per_round: dict[int, list[dict[str, Any]]] = {}
    threading.Thread.start = counting_start  # type: ignore[method-assign]
    json5.loads = timed_json5
    try:
        with client_cpu() as client, lsn_engine.connect() as lsn_conn:
            _walinspect(lsn_conn)
            for _ in range(repeats):
                run_id = submit(rt, make_agent(rounds))
                marks: list[
                    tuple[int, int, float, int, Counter[str], Counter[str], float, float, float]
                ] = []
                while queue:
                    d = queue.popleft()
                    if d.kind == "round":
                        seq = int(
                            lsn_conn.execute(
                                sa.text("SELECT event_seq FROM runs WHERE id = :r"), {"r": run_id}
                            ).scalar_one()
                        )
                        marks.append(
                            (
                                wal_lsn(lsn_conn),
                                probe.mark(),
                                time.perf_counter(),
                                seq,
                                Counter(published),
                                Counter(spawned),
                                json5_s[0],
                                time.thread_time() - client[0],
                                client[0],
                            )
                        )
                        run_round(rt, d.run_id, d.version)
                    elif d.kind == "tool":
                        run_tool(rt, d.run_id, d.call_id, d.version)
                sizes = _row_sizes(lsn_conn, run_id, [m[3] for m in marks])
                model = dict(
                    lsn_conn.execute(
                        sa.text(
                            "SELECT round, latency_ms FROM usage WHERE run_id = :r AND purpose = "
                            "'round'"
                        ),
                        {"r": run_id},
                    ).all()
                )
                for k in range(1, min(rounds, len(marks) - 1) + 1):
                    (w0, p0, t0, _, pub0, sp0, j0, c0, m0) = marks[k - 1]
                    (w1, p1, t1, _, pub1, sp1, j1, c1, m1) = marks[k]
                    per_round.setdefault(k, []).append(
                        {
                            "wal": own_wal(lsn_conn, w0, w1),
                            "cluster_wal": w1 - w0,
                            "seconds": t1 - t0 - (model.get(k) or 0) / 1000,
                            "cpu": c1 - c0,
                            "client_cpu": m1 - m0,
                            "json5": j1 - j0,
                            **probe.summary(p0, p1),
                            "txns": probe.transactions(p0, p1),
                            "rows_bytes": sizes.get(k, 0),
                            "published": pub1 - pub0,
                            "threads": sp1 - sp0,
                        }
                    )
    finally:
        json5.loads = real_json5
        threading.Thread.start = real_start  # type: ignore[method-assign]
        lsn_engine.dispose()
        close_runtime(rt)
    last = max(per_round)
    return {k: _pick(per_round, k, last) for k in per_round}


def _pick(per_round: dict[int, list[dict[str, Any]]], k: int, last: int) -> dict[str, Any]:
    """Round k: its counts from its fastest repeat; time = the median over rounds k±2 of all
    repeats; WAL = the smallest over those (other databases write WAL to the same cluster and
    checkpoints add full-page images: the smallest is the closest to the round's own)."""
    near = [s for j in range(max(1, k - 2), min(last, k + 2) + 1) for s in per_round[j]]
    best = dict(min(per_round[k], key=lambda s: s["seconds"]))
    best["seconds"] = med([s["seconds"] for s in near])
    best["json5"] = med([s["json5"] for s in near])
    best["sql_s"] = med([s["sql_s"] for s in near])
    best["cpu"] = med([s["cpu"] for s in near])
    best["client_cpu"] = med([s["client_cpu"] for s in near])
    best["wal"], best["fpi"] = min(s["wal"] for s in per_round[k])
    return best


def own_wal(conn: sa.Connection, a: int, b: int) -> tuple[int, int]:
    """WAL bytes between two positions written for this database only (pg_walinspect: the
    records of transactions that touched its relations, their commit records included, and
    xid-less records on its relations); the LSN difference when the extension is missing."""
    if not WALINSPECT[0]:
        return b - a, 0
    row = conn.execute(
        sa.text(
            "WITH r AS (SELECT xid, record_length, fpi_length, block_ref FROM "
            "pg_get_wal_records_info("
            "CAST(:a AS pg_lsn), CAST(:b AS pg_lsn))), "
            "mine AS (SELECT DISTINCT xid FROM r WHERE xid <> 0 AND block_ref LIKE :pat) "
            "SELECT coalesce(sum(record_length), 0), coalesce(sum(fpi_length), 0) FROM r "
            "WHERE xid IN (SELECT xid FROM mine) OR (xid = 0 AND block_ref LIKE :pat)"
        ),
        {"a": _lsn(a), "b": _lsn(b), "pat": f"%/{DB_OID[0]}/%"},
    ).one()
    return int(row[0]), int(row[1])


def _lsn(x: int) -> str:
    return f"{x >> 32:X}/{x & 0xFFFFFFFF:X}"


WALINSPECT = [False]
PREPING = ["?"]
DB_OID = [0]


def _walinspect(conn: sa.Connection) -> None:
    try:
        conn.execute(sa.text("CREATE EXTENSION IF NOT EXISTS pg_walinspect"))
        WALINSPECT[0] = True
    except sa.exc.DBAPIError:
        WALINSPECT[0] = False
    DB_OID[0] = int(
        conn.execute(
            sa.text("SELECT oid FROM pg_database WHERE datname = current_database()")
        ).scalar_one()
    )


def _row_sizes(conn: sa.Connection, run_id: str, event_marks: list[int]) -> dict[int, int]:
    """Bytes of the rows each round inserted (messages, tool_calls, usage, events), plus one
    new version of the runs row per UPDATE of it (counted by the caller's statement log)."""
    out: Counter[int] = Counter()
    for table in ("messages", "tool_calls", "usage"):
        for k, b in conn.execute(
            sa.text(
                f"SELECT round, sum(pg_column_size(t.*)) FROM {table} t WHERE run_id = :r "
                "GROUP BY round"
            ),
            {"r": run_id},
        ).all():
            out[int(k)] += int(b)
    evs = conn.execute(
        sa.text("SELECT seq, pg_column_size(t.*) FROM events t WHERE run_id = :r"), {"r": run_id}
    ).all()
    for k in range(1, len(event_marks)):
        lo, hi = event_marks[k - 1], event_marks[k]
        out[k] += sum(int(b) for s, b in evs if lo < s <= hi)
    return dict(out)


def runs_row_bytes(url: str) -> int:
    eng = sa.create_engine(url)
    with eng.connect() as conn:
        v = conn.execute(sa.text("SELECT avg(pg_column_size(t.*)) FROM runs t")).scalar()
    eng.dispose()
    return int(v or 0)


GROWTH_PAIRS, GROWTH_NEAR = 5, 5  # pairs of runs; rounds either side of 10 and of LONG


def cpu_growth(
    url: str, prefix: str, make_agent: Callable[[int], dict[str, Any]], pairs: int = GROWTH_PAIRS
) -> dict[str, Any]:
    """Engine CPU per round at round LONG vs round 10, side by side: a long run is driven
    alone to round LONG - 10, then a new run starts and the two are driven turn about (one
    broker list, first in first out), so the long run's rounds LONG±5 and the new run's
    rounds 10±5 share the same minutes of the machine. Engine CPU = this thread's CPU in
    the round and tool dispatches of that round, minus the model client's ``complete()``."""
    from shared.engine.livebus import InProcessBus

    queue: deque[Any] = deque()
    rt = replace(treadle_runtime(url, prefix), publish=queue.extend, live=InProcessBus())
    late: list[float] = []
    early: list[float] = []
    try:
        with client_cpu() as client:
            _drive_pairs(rt, queue, make_agent, pairs, client, late, early)
    finally:
        close_runtime(rt)
    return {"late": med(late), "early": med(early), "n": len(late)}


def _drive_pairs(
    rt: Any,
    queue: deque[Any],
    make_agent: Callable[[int], dict[str, Any]],
    pairs: int,
    client: list[float],
    late: list[float],
    early: list[float],
) -> None:
    from shared.engine.round import run_round
    from shared.engine.toolrun import run_tool

    for _ in range(pairs):
        long_id = submit(rt, make_agent(LONG + GROWTH_NEAR + 3))
        cpu: dict[tuple[str, int], float] = {}
        rounds: dict[str, int] = {}
        while queue:
            d = queue.popleft()
            if d.kind == "round":
                rounds[d.run_id] = rounds.get(d.run_id, 0) + 1
                if d.run_id == long_id and rounds[d.run_id] == LONG - 10:
                    submit(rt, make_agent(10 + GROWTH_NEAR + 3))
            c, m = time.thread_time(), client[0]
            if d.kind == "round":
                run_round(rt, d.run_id, d.version, d.attempt)
            elif d.kind == "tool":
                run_tool(rt, d.run_id, d.call_id, d.version)
            key = (d.run_id, rounds.get(d.run_id, 0))
            cpu[key] = cpu.get(key, 0.0) + (time.thread_time() - c) - (client[0] - m)
        for (rid, k), x in cpu.items():
            if rid == long_id and abs(k - LONG) <= GROWTH_NEAR:
                late.append(x)
            elif rid != long_id and abs(k - 10) <= GROWTH_NEAR:
                early.append(x)


# --------------------------------------------------------------------------- main


def _per_hop(ratio: float) -> str:
    """A tool round is two tasks (round, tool); with reads run in the round, one."""
    if reads_in_round():
        return "one task per tool round: the read runs in the round's"
    return f"= {ratio / 2:.2f} x two hops"


BARE_NOTE = (
    "The protocol, bare (`bench/floorapp.py` `bare_round`, `bare_tool`; NOT treadle: raw "
    "Celery tasks on the floor's worker, the same model and tool processes, in the same "
    "blocks) makes a tool round's round trips with no engine. The round task claims (one "
    "UPDATE), calls the model (streamed SSE, httpx + httpx-sse, the same history) and "
    "commits (one statement: the UPDATE and the round's row), then sends the tool task. The "
    "tool task reads the row (no transaction, as treadle reads), POSTs to the tool in a kept "
    "thread while its claim commits (as treadle runs a read), commits (one UPDATE: no result "
    "row, so a lower bound) and sends the next round. Its model time is cut to whole "
    "milliseconds, as treadle's `usage.latency_ms` is. It is what this shape costs before any "
    "of treadle's own work; the two other bare rows price shapes that are not the default."
)
FLOOR_CONC = 4  # the floor's worker threads (its chains and the bare ones run one at a time)
BARE_SHAPES = {
    "default": "the protocol, bare: the default shape's round trips, no engine (NOT treadle)",
    "fold": "the protocol, bare, the tool's claim folded into its commit (NOT treadle, "
    "NOT its default shape)",
    "in_round": "the protocol, bare, the tool called in the round task: one hop a round "
    "(NOT treadle, NOT its default shape)",
}


def main() -> None:
    started = time.time()
    procs = Procs()
    sections: list[Section] = []
    llm = FakeLLMServer(quick_tool_responder).start()  # the quick-tool row's model (a thread)
    with scratch_db("rounds") as url:
        prefix, fprefix = new_prefix("rounds"), new_prefix("rfloor")
        rt = treadle_runtime(url, prefix)
        floors: list[FloorResult] = []
        run_ids: list[str] = []
        quick_ids: list[str] = []
        bare: dict[str, list[float]] = {shape: [] for shape in BARE_SHAPES}
        try:
            outside = Outside(procs)
            real = outside.agent

            def quick(n: int) -> dict[str, Any]:
                return http_model_quick_tool_agent(llm.base_url, n)

            floor = Floor(procs, url, fprefix, concurrency=FLOOR_CONC)
            start_treadle_workers(procs, treadle_env(url, prefix), 1, 8)
            run_and_wait(rt, real(3), timeout=60)  # ready and warm
            run_and_wait(rt, quick(3), timeout=60)
            for i in range(RUNS):
                log(f"rounds: block {i + 1}/{RUNS}: floor, a {ROUNDS}-round run, a quick one")
                floors.append(floor.run(chains=1, hops=FLOOR_HOPS))
                for shape in BARE_SHAPES:
                    bare[shape] += floor.bare(ROUNDS, [outside.model_url, outside.tool_url], shape)
                run_ids.append(run_and_wait(rt, real(ROUNDS)))
                quick_ids.append(run_and_wait(rt, quick(ROUNDS)))
            floors.append(floor.run(chains=1, hops=FLOOR_HOPS))
            log(f"rounds: a {LONG}-round run")
            long_id = run_and_wait(rt, real(LONG), timeout=600)
            floors.append(floor.run(chains=1, hops=FLOOR_HOPS))
            floor.close()
            log("rounds: Redis commands of a 20-round run (MONITOR)")
            commands, mon_rounds = redis_commands(rt, real, 20)
            rows = [r for rid in run_ids for r in round_phases(rt.engine, rid)]
            quick_rows = [r for rid in quick_ids for r in round_phases(rt.engine, rid)]
            long_rows = round_phases(rt.engine, long_id)
            log(f"rounds: in-process anatomy, a {LONG}-round run")
            per_round = anatomy(url, prefix, real, LONG)
            log(f"rounds: engine CPU at round {LONG} vs round 10, side by side")
            growth = cpu_growth(url, prefix, real)
        finally:
            procs.stop_all()
            close_runtime(rt)
        row_size = runs_row_bytes(url)
        redis_cleanup(prefix)
        redis_cleanup(fprefix)
    llm.stop()
    fl = merge(floors)
    hop_med, hop_p95 = med(fl.hop_latencies), p95(fl.hop_latencies)
    over = [r["overhead"] for r in rows]

    s = Section(
        f"Tool round overhead vs the floor, {path_name()} ({RUNS} runs x {ROUNDS} "
        "rounds, HTTP model in its own process, one inline HTTP tool, 1 worker "
        f"`-P threads -c 8`, {'defaults but the opt-in' if opted_in() else 'defaults'})",
        ["measure", "median ms", "p95 ms", "in floor hops (median)", "target", "verdict"],
    )
    s.row("floor hop (1 chain, interleaved)", ms(hop_med, 2), ms(hop_p95, 2), "1.00", "", "")
    ratio = med(over) / hop_med
    s.row(
        "**tool round overhead** (model + one tool, minus the model call)",
        ms(med(over), 2),
        ms(p95(over), 2),
        f"**{ratio:.2f}** ({_per_hop(ratio)}; p95 {p95(over) / hop_p95:.2f})",
        f"<= {TARGET_HOPS}",
        verdict(ratio <= TARGET_HOPS),
    )
    quick = [r["overhead"] for r in quick_rows]
    qratio = med(quick) / hop_med
    s.row(
        "quick-tool round overhead (NOT the path users run: in-process `quick` tool, "
        "fake model in a thread of the bench process)",
        ms(med(quick), 2),
        ms(p95(quick), 2),
        f"{qratio:.2f}",
        "no slower than before (1.79)",
        "",
    )
    for shape, label in BARE_SHAPES.items():
        xs = bare[shape]
        s.row(label, ms(med(xs), 2), ms(p95(xs), 2), f"{med(xs) / hop_med:.2f}", "", "")
    models = [r["model"] for r in rows]
    s.row(
        "model call (fake model process, no latency; `usage.latency_ms`)",
        ms(med(models), 2),
        ms(p95(models), 2),
        "",
        "",
        "",
    )
    s.note(
        "Overhead of round k = (round k+1 claimed) - (round k claimed) - (round k's model "
        "call), from the `events` and `usage` rows the engine writes; the floor blocks "
        f"({len(floors)} x {FLOOR_HOPS} hops) alternate with the runs on the same Redis and "
        "PostgreSQL. A tool round is two hops by construction (the round task, the tool "
        f"task): ideal 2.0 floor hops, target {TARGET_HOPS}. " + BARE_NOTE
    )
    sections.append(s)

    s = Section(
        "Where a tool round's time goes (medians)",
        ["phase", "median ms", "p95 ms", "in floor hops"],
    )
    for key, label in (
        ("claim_model", "round claim txn + history read + request (model call excluded)"),
        ("commit_to_tool", "round commit txn + publish → tool task claimed"),
        ("tool", "tool claim txn (a read runs beside it) + the rest of the tool"),
        ("tool_commit_to_round", "tool commit txn (join) + publish → next round claimed"),
    ):
        xs = [r[key] for r in rows]
        s.row(label, ms(med(xs), 2), ms(p95(xs), 2), f"{med(xs) / hop_med:.2f}")
    s.note(
        "Phase boundaries are the timestamps in `events` (round.started, tool.started, "
        "tool.finished) and the assistant message's `created_at`; each is taken just "
        "before its transaction begins. A read-only call starts before its claim, so its "
        "first moments fall in the phase before."
        + (
            " With reads run in the round (`TREADLE_WORKER_READ_TOOLS_IN_ROUND`) the tool's "
            "events are written with the round's commit: the two tool phases read 0 and the "
            "tool's time is in the first phase's neighbours."
            if reads_in_round()
            else ""
        )
    )
    sections.append(s)

    s = Section(
        f"Per-round time and bytes as the run grows ({LONG}-round run)",
        [
            "round",
            "overhead ms (real worker, k±2)",
            "in floor hops",
            "engine in-process ms",
            "engine CPU ms",
            "of which json5 ms",
            "model client CPU ms",
            "rows read",
            "WAL bytes",
            "row bytes written",
            "statements",
            "commits",
            "pool checkouts",
        ],
    )
    for k in AT:
        xs = window(long_rows, k, "overhead")
        a = per_round.get(k, {})
        s.row(
            k,
            ms(med(xs), 2),
            f"{med(xs) / hop_med:.2f}",
            ms(a.get("seconds", float("nan")), 2),
            ms(a.get("cpu", float("nan")), 2),
            ms(a.get("json5", float("nan")), 2),
            ms(a.get("client_cpu", float("nan")), 2),
            a.get("rows", ""),
            f"{a.get('wal', 0):,}" + (f" ({a['fpi']:,} FPI)" if a.get("fpi") else ""),
            f"{a.get('rows_bytes', 0) + row_size * _runs_updates(a):,}",
            a.get("statements", ""),
            a.get("commits", ""),
            a.get("checkouts", ""),
        )
    w1, wl = per_round.get(AT[0], {}).get("wal", 0), per_round.get(AT[-1], {}).get("wal", 0)
    flat = wl <= max(w1, 1) * 1.25
    r1 = per_round.get(AT[0], {}).get("rows", 0) or 1
    rl = per_round.get(AT[-1], {}).get("rows", 0)
    reads = (
        "`rows read` (rows returned by the round's SELECTs and UPDATE … RETURNING) grows "
        "with the run: the round claim reads the whole history every round"
        if rl > 2 * r1
        else "`rows read` (rows returned by the round's SELECTs and UPDATE … RETURNING) is "
        "flat: the history is read incrementally"
    )
    s.note(
        f"Target: bytes written per round flat to round {AT[-1]}: WAL at round {AT[-1]} is "
        f"{wl / max(w1, 1):.2f}x round {AT[0]} → {verdict(flat)}. {reads}."
    )
    s.note(
        f"Engine in-process = the same round (round task + tool task, model call excluded) "
        f"driven by this process with a list for a broker (no Celery): the median over rounds "
        f"k±2; engine CPU = this thread's CPU time outside the model client's `complete()` "
        f"(model client CPU = inside it: encoding the request, which carries the whole history, "
        f"and parsing the streamed reply). WAL = the bytes of the WAL records the round wrote "
        f"for this database (pg_walinspect over the round's LSN range: records of transactions "
        f"that touched the bench database, commits included; other databases share the cluster's"
        f" WAL), full-page images included when a checkpoint fell in the round. Row bytes = "
        f"`pg_column_size` of the rows the round inserted (messages, tool_calls, usage, events) "
        f"+ one {row_size:,}-byte `runs` row version per UPDATE of it."
    )
    s.note(
        f"The engine CPU of this table is measured one run after another (minutes apart on a "
        f"shared machine). The summary's growth ratio is measured side by side: a run driven "
        f"to round {LONG - 10}, then a new run, the two driven turn about, so the long run's "
        f"rounds {LONG}±{GROWTH_NEAR} and the new run's rounds 10±{GROWTH_NEAR} run in the same "
        f"minutes ({growth['n']} rounds each, {GROWTH_PAIRS} pairs; medians): "
        f"{ms(growth['late'], 2)} vs {ms(growth['early'], 2)} ms "
        f"({growth['late'] / growth['early']:.2f}x)."
    )
    sections.append(s)

    ref = per_round.get(10) or per_round.get(max(per_round))
    s = Section("Anatomy of one tool round (round 10, in-process)", ["transaction", "statements"])
    for i, txn in enumerate(ref["txns"], 1):
        s.row(i, " · ".join(txn))
    pub = ref["published"]
    s.note(
        f"Per round: {ref['statements']} statements in {ref['commits']} commits "
        f"(+{ref['rollbacks']} ROLLBACKs sent for read-only connections; reads through "
        f"`shared.store.db.reading` send none), {ref['checkouts']} pool "
        f"checkouts ({PREPING[0]}). "
        f"Of the round's {ref['seconds'] * 1000:.2f} ms in-process (model call excluded): "
        f"SQL statements {ref['sql_s'] * 1000:.2f} ms, `json5.loads` of the tool arguments "
        f"(shared/engine/toolrun.py `execute_tool`) {ref['json5'] * 1000:.2f} ms; CPU "
        f"{ref['cpu'] * 1000:.2f} ms. "
        + ", ".join(f"{v} {k}" for k, v in sorted(pub.items()))
        + "; threads started: "
        + ", ".join(f"{v} {k}" for k, v in sorted(ref["threads"].items()))
        + "."
    )
    sections.append(s)

    s = Section(
        f"Redis commands per tool round (MONITOR over a {mon_rounds}-round run)",
        ["command", "per round"],
    )
    for cmd, n in commands.most_common():
        s.row(cmd, num(n / mon_rounds, 1))
    s.row("**total**", num(sum(commands.values()) / mon_rounds, 1))
    s.note(
        "All commands on the bench's Redis DB while one run ran (worker + the submitting "
        "process; PUBLISH = live wake-ups, and Celery task events when "
        "`TREADLE_TASK_EVENTS` is on)."
    )
    sections.append(s)
    k0 = 10
    x1, xl = growth["early"], growth["late"]
    head = [
        [
            "tool round overhead, HTTP model + HTTP tool, in floor hops (median)" + opt_in_label(),
            f"{ratio:.2f} ({ms(med(over), 1)} ms vs hop {ms(hop_med, 2)} ms)",
            f"<= {TARGET_HOPS}",
            verdict(ratio <= TARGET_HOPS),
        ],
        [
            "quick-tool round overhead (in-process tool, NOT the path users run), floor hops",
            f"{qratio:.2f} ({ms(med(quick), 1)} ms)",
            "<= 1.79 (before)",
            verdict(qratio <= 1.79),
        ],
        [
            f"WAL bytes per round, round {AT[-1]} vs round {AT[0]}",
            f"{wl:,} vs {w1:,} ({wl / max(w1, 1):.2f}x)",
            "flat",
            verdict(flat),
        ],
        [
            f"engine CPU per round (in-process, model client excluded, side by side), "
            f"round {LONG} vs round {k0}",
            f"{ms(xl, 2)} vs {ms(x1, 2)} ms ({xl / x1:.2f}x)",
            "<= 1.1x",
            verdict(xl <= 1.1 * x1),
        ],
        [
            "statements / commits per tool round",
            f"{ref['statements']} / {ref['commits']}"
            + (f" (+{ref['checkouts']} pre-pings)" if "on" in PREPING[0][:40] else ""),
            "",
            "",
        ],
    ]
    emit("rounds", "Tool rounds vs the floor", sections, started, head)


def _runs_updates(a: dict[str, Any]) -> int:
    return sum(1 for t in a.get("txns", []) for label in t if label == "UPDATE runs")


if __name__ == "__main__":
    main()
