"""The floor: a raw Celery chain of hops on the same Redis broker, each hop one small versioned
SQL transaction (INSERT + ``UPDATE … WHERE version = v``) on the same PostgreSQL. Per-hop
latency of one chain, and hops/s with 20 concurrent chains; then the same with treadle's
Celery task events on, and with SQLAlchemy's ``pool_pre_ping`` too (what those cost a hop).
The variants run side by side (one worker each, own broker prefix) and their blocks alternate,
so a noisy neighbour hits them alike.

    python -m bench.floor      (BENCH_FLOOR_HOPS, BENCH_FLOOR_CHAINS, BENCH_FLOOR_CHAIN_HOPS,
                                BENCH_FLOOR_REPEATS to resize)
"""

from __future__ import annotations

import os
import time

from bench.common import (
    Floor,
    FloorResult,
    Procs,
    Section,
    emit,
    log,
    med,
    merge,
    ms,
    new_prefix,
    num,
    p95,
    redis_cleanup,
    scratch_db,
)

HOPS = int(os.environ.get("BENCH_FLOOR_HOPS", "100"))
CHAINS = int(os.environ.get("BENCH_FLOOR_CHAINS", "20"))
CHAIN_HOPS = int(os.environ.get("BENCH_FLOOR_CHAIN_HOPS", "30"))
REPEATS = int(os.environ.get("BENCH_FLOOR_REPEATS", "3"))
VARIANTS = [
    ("raw Celery + one SQL transaction (**the floor**)", False, False),
    ("+ Celery task events (`TREADLE_TASK_EVENTS`, or Flower)", True, False),
    ("+ task events + `pool_pre_ping`", True, True),
]


def main() -> None:
    started = time.time()
    procs = Procs()
    table = Section(
        "Floor: one hop = a Celery task doing one versioned SQL transaction",
        [
            "variant",
            "1 chain: hop median ms",
            "p95 ms",
            "20 chains: hop median ms",
            "p95 ms",
            "hops/s (20 chains)",
            "worker CPU ms/hop (20 chains)",
        ],
    )
    prefixes = [new_prefix(f"floor{i}") for i in range(len(VARIANTS))]
    with scratch_db("floor", treadle_schema=False) as url:
        floors: list[Floor] = []
        try:
            for (label, events, preping), prefix in zip(VARIANTS, prefixes, strict=True):
                log(f"floor: start worker for {label}")
                floors.append(
                    Floor(procs, url, prefix, concurrency=CHAINS, events=events, preping=preping)
                )
            one: list[list[FloorResult]] = [[] for _ in VARIANTS]
            many: list[list[FloorResult]] = [[] for _ in VARIANTS]
            for rep in range(REPEATS):
                log(f"floor: repeat {rep + 1}/{REPEATS}")
                for i, floor in enumerate(floors):
                    one[i].append(floor.run(chains=1, hops=HOPS))
                for i, floor in enumerate(floors):
                    many[i].append(floor.run(chains=CHAINS, hops=CHAIN_HOPS))
        finally:
            for floor in floors:
                floor.close()
            procs.stop_all()
            for prefix in prefixes:
                redis_cleanup(prefix)
    head: list[list[str]] = []
    for (label, _, _), o, m in zip(VARIANTS, one, many, strict=True):
        a, b = merge(o), merge(m)
        if not head:
            head = [
                [
                    "floor hop, 1 chain (median / p95)",
                    f"{ms(med(a.hop_latencies), 2)} / {ms(p95(a.hop_latencies), 2)} ms",
                    "",
                    "",
                ],
                ["floor, 20 chains", f"{num(b.hops_per_s, 0)} hops/s", "", ""],
            ]
        elif "pre_ping" not in label:
            head.append(
                [
                    "floor + Celery task events, 20 chains",
                    f"{num(b.hops_per_s, 0)} hops/s, worker CPU "
                    f"{ms(b.worker_cpu / b.hops, 2)} ms/hop",
                    "",
                    "",
                ]
            )
        table.row(
            label,
            ms(med(a.hop_latencies), 2),
            ms(p95(a.hop_latencies), 2),
            ms(med(b.hop_latencies), 1),
            ms(p95(b.hop_latencies), 1),
            num(b.hops_per_s, 0),
            ms(b.worker_cpu / b.hops, 2),
        )
    table.note(
        f"1 chain: {REPEATS} x {HOPS} sequential hops; 20 chains: {REPEATS} x {CHAINS} "
        f"chains of {CHAIN_HOPS} hops at once. One worker process per variant, "
        f"`-P threads -c {CHAINS}`, its own broker prefix; the variants' blocks "
        "alternate. Hop latency = start of hop n+1 - start of hop n (the transaction, "
        "the send, the broker, the pickup). Worker CPU = utime+stime of the worker "
        "process / hops."
    )
    table.note(
        "Every treadle script below measures its own one-chain floor (the first row's "
        "setup, interleaved with its treadle blocks) and quotes its ratios against it."
    )
    emit("floor", "Floor (raw Celery + PostgreSQL hop)", [table], started, head)


if __name__ == "__main__":
    main()
