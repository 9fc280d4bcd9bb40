"""The floor: a raw Celery chain of hops on the same Redis broker, each hop one small versioned
SQL transaction (INSERT + ``UPDATE … WHERE version = v``) on the same PostgreSQL. Per-hop
latency of one chain, and hops/s with 20 concurrent chains; then the same with treadle's
Celery task events on, and with its engine's ``pool_pre_ping`` too (what those cost a hop).

    python -m bench.floor            (BENCH_FLOOR_HOPS, BENCH_FLOOR_CHAINS to resize)
"""

from __future__ import annotations

import os
import time

from bench.common import (
    Floor,
    Procs,
    Section,
    emit,
    log,
    med,
    ms,
    new_prefix,
    num,
    p95,
    redis_cleanup,
    scratch_db,
)

HOPS = int(os.environ.get("BENCH_FLOOR_HOPS", "300"))
CHAINS = int(os.environ.get("BENCH_FLOOR_CHAINS", "20"))
CHAIN_HOPS = int(os.environ.get("BENCH_FLOOR_CHAIN_HOPS", "100"))
VARIANTS = [
    ("raw Celery + one SQL transaction (the floor)", False, False),
    ("+ task events (treadle's Celery config)", True, False),
    ("+ task events + pool_pre_ping (treadle's engine)", True, True),
]


def main() -> None:
    started = time.time()
    procs = Procs()
    table = Section("Floor: one hop = a Celery task doing one versioned SQL transaction",
                    ["variant", "1 chain: hop median ms", "p95 ms", "20 chains: hop median ms",
                     "p95 ms", "hops/s (20 chains)", "worker CPU ms/hop"])
    base = None
    with scratch_db("floor", treadle_schema=False) as url:
        prefix = new_prefix("floor")
        try:
            for label, events, preping in VARIANTS:
                log(f"floor: {label}")
                floor = Floor(procs, url, prefix, concurrency=CHAINS, events=events,
                              preping=preping)
                try:
                    one = floor.run(chains=1, hops=HOPS)
                    many = floor.run(chains=CHAINS, hops=CHAIN_HOPS)
                finally:
                    floor.close()
                base = base or one
                table.row(label, ms(med(one.hop_latencies), 2), ms(p95(one.hop_latencies), 2),
                          ms(med(many.hop_latencies), 2), ms(p95(many.hop_latencies), 2),
                          num(many.hops_per_s, 0), ms(many.worker_cpu / many.hops, 2))
        finally:
            procs.stop_all()
            redis_cleanup(prefix)
    table.note(f"1 chain: {HOPS} sequential hops; 20 chains: {CHAINS} chains x {CHAIN_HOPS} "
               f"hops at once, one worker process `-P threads -c {CHAINS}`. Hop latency = "
               "start of hop n+1 - start of hop n (the transaction, the send, the broker, the "
               "pickup). Worker CPU = utime+stime of the worker process / hops.")
    table.note("Every treadle script measures its own one-chain floor (first row's setup) in "
               "the same run and quotes its ratios against it.")
    emit("floor", "Floor (raw Celery + PostgreSQL hop)", [table], started)


if __name__ == "__main__":
    main()
