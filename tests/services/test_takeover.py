"""Fast takeover with the default settings (lease 10 s renewed every ~3 s, reaper every 2 s):
workers SIGKILLed mid model call and mid write; no run stalls longer than 20 s, each write
applies once. The longest pause between two consecutive events of a run is the figure.

Bigger storms: ``TAKEOVER_RUNS=60 TAKEOVER_KILLS=20 pytest tests/services/test_takeover.py -s``;
the stopped-inside-a-transaction case as stated (150 s): ``STOPPED_S=150 pytest -s -k inside``
(30 s by default, 20 s under CI=true; ``STOPPED_BEFORE_S``: the window measured before it,
15 s, 10 s under CI=true).
"""

from __future__ import annotations

import os
import random
import re
import signal
import threading
import time
from collections.abc import Iterator
from datetime import datetime

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from scheduler.app import create_app
from scheduler.embedded import ReaperLoop
from shared.config import Settings
from shared.engine.runtime import Runtime
from shared.store.tables import usage
from tests.support import (
    ROUND_DONE,
    EffectServer,
    WorkerProcs,
    knob,
    longest_stalls,
    record_agent,
    wait_completed,
)

RUNS = int(os.environ.get("TAKEOVER_RUNS", "12"))
KILLS = int(os.environ.get("TAKEOVER_KILLS", "2"))
TARGET_S = 20.0
# the stop outlasts the idle-in-transaction timeout (10 s) and the lease (10 s) + a reaper
# pass either way; under CI=true the stop and the window before it are shorter
STOPPED_S = knob("STOPPED_S", 30, 20)
BEFORE_S = knob("STOPPED_BEFORE_S", 15, 10)


@pytest.fixture
def effects() -> Iterator[EffectServer]:
    with EffectServer(delay=0.5) as server:
        yield server


@pytest.fixture
def fast_recovery(effects: EffectServer) -> dict[str, str]:
    return {  # the defaults (the suite's fixtures use a 15 s re-drive)
        "TREADLE_ALLOW_HOSTS": f"127.0.0.1:{effects.port}",
        "TREADLE_REDRIVE_SECONDS": str(Settings().redrive_seconds),
    }


def test_sigkilled_workers_runs_resume_within_the_target(
    prod_rt: Runtime, workers: WorkerProcs, effects: EffectServer
) -> None:
    defaults = Settings()
    assert prod_rt.settings.lease_seconds == defaults.lease_seconds == 10
    assert defaults.reaper_interval == 2
    rng = random.Random(int(os.environ.get("TAKEOVER_SEED", "3")))
    workers.start_many([None, None], concurrency=8)
    reaper = ReaperLoop(prod_rt, defaults.reaper_interval).start()
    kills = 0
    started = time.monotonic()
    try:
        with TestClient(create_app(lambda: prod_rt)) as client:
            ids = [
                client.post(
                    "/v1/runs",
                    json={"agent": record_agent(i, effects.url, "abc", 1.5), "input": f"go {i}"},
                ).json()["id"]
                for i in range(RUNS)
            ]
            while kills < KILLS:
                time.sleep(rng.uniform(2.0, 6.0))  # mid model call or mid write
                workers.kill(rng.choice(list(workers.procs)))
                kills += 1
                workers.start(concurrency=8)  # a supervisor replaces it at once
            wait_completed(client, ids, 120, "every run completed")
    finally:
        reaper.stop()
    stalls = longest_stalls(prod_rt.engine, ids)
    worst = max(stalls.values())
    over = sum(1 for s in stalls.values() if s > TARGET_S)
    print(
        f"\ntakeover: runs={RUNS} kills={kills} max_stall={worst:.1f}s "
        f"runs_over_{TARGET_S:.0f}s={over} seconds={time.monotonic() - started:.0f} "
        f"tool_requests={sum(effects.hits.values())}"
    )
    assert worst <= TARGET_S, sorted(stalls.values())[-5:]
    assert len(effects.effects) == 3 * RUNS and set(effects.effects.values()) == {1}


# --- a worker stopped inside a transaction ----------------------------------------------------


def _stop_inside_a_transaction(engine: sa.engine.Engine, pid: int, tries: int = 400) -> float:
    """SIGSTOP the worker ``pid`` at a moment one of its sessions is inside a transaction
    (seen in ``pg_stat_activity`` after the stop: ``idle in transaction``); a try that caught
    it between transactions is undone at once (SIGCONT) and repeated. The monotonic time of
    the stop."""
    rng = random.Random(5)
    query = sa.text(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = :name"
        " AND state = 'idle in transaction'"
    )
    for _ in range(tries):
        os.killpg(pid, signal.SIGSTOP)
        stopped = time.monotonic()
        time.sleep(0.1)  # a statement in flight finishes on the server
        with engine.connect() as conn:
            if conn.execute(query, {"name": f"treadle/{pid}"}).scalar_one():
                return stopped
        os.killpg(pid, signal.SIGCONT)
        time.sleep(rng.uniform(0.02, 0.25))
    raise AssertionError(f"never caught worker {pid} inside a transaction in {tries} tries")


_DONE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*" + ROUND_DONE,
    re.M,
)


def _rounds_at(log: str) -> list[float]:
    """Wall-clock times of the rounds a worker's log says it finished."""
    fmt = "%Y-%m-%d %H:%M:%S,%f"
    return [datetime.strptime(m, fmt).astimezone().timestamp() for m in _DONE.findall(log)]


def test_a_worker_stopped_inside_a_transaction_stalls_neither_runs_nor_the_other_worker(
    prod_rt: Runtime, workers: WorkerProcs, effects: EffectServer
) -> None:
    """Steady load (2 runs/s, 3 rounds each, one write per tool round) on workers alpha and
    beta; alpha is SIGSTOPped while one of its sessions is inside a transaction (holding row
    locks) for ``STOPPED_S`` (a long GC pause, a partition). The server ends that session
    after the idle-in-transaction timeout; alpha's runs are taken over within the target;
    beta's rounds/s while alpha is stopped stay >= 80 % of its rounds/s before (it never
    parks behind alpha's locks); when alpha wakes its late commits lose: each write applied
    once, each round committed once."""
    workers.start_many(["alpha", "beta"], concurrency=8)
    reaper = ReaperLoop(prod_rt, Settings().reaper_interval).start()
    ids: list[str] = []
    feeding = threading.Event()
    feeding.set()

    def feed() -> None:
        with TestClient(create_app(lambda: prod_rt)) as client:
            i = 0
            while feeding.is_set():
                agent = record_agent(i, effects.url, "ab", 0.3)
                resp = client.post("/v1/runs", json={"agent": agent, "input": f"go {i}"})
                ids.append(resp.json()["id"])
                i += 1
                time.sleep(0.5)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    alpha = workers.procs["alpha"].pid
    before_s = BEFORE_S
    try:
        time.sleep(3.0 + before_s)  # warm up, then the window before the stop
        stopped = _stop_inside_a_transaction(prod_rt.engine, alpha)
        stopped_wall = time.time() - (time.monotonic() - stopped)
        try:
            time.sleep(max(0.0, stopped + STOPPED_S - time.monotonic()))
        finally:
            os.killpg(alpha, signal.SIGCONT)
        feeding.clear()
        feeder.join(10)
        with TestClient(create_app(lambda: prod_rt)) as client:
            wait_completed(client, ids, 120, "every run completed")
    finally:
        feeding.clear()
        reaper.stop()
    beta = _rounds_at(workers.log("beta"))
    before = sum(stopped_wall - before_s <= t < stopped_wall for t in beta) / before_s
    during = sum(stopped_wall <= t < stopped_wall + STOPPED_S for t in beta) / STOPPED_S
    stalls = longest_stalls(prod_rt.engine, ids)
    worst = max(stalls.values())
    print(
        f"\nstopped inside a transaction: {STOPPED_S:.0f} s, runs={len(ids)} "
        f"beta rounds/s before={before:.2f} during={during:.2f} ({during / before:.0%}) "
        f"max_stall={worst:.1f}s runs_over_{TARGET_S:.0f}s="
        f"{sum(s > TARGET_S for s in stalls.values())}"
    )
    assert during >= 0.8 * before
    assert worst <= TARGET_S, sorted(stalls.values())[-5:]
    assert len(effects.effects) == 2 * len(ids) and set(effects.effects.values()) == {1}
    with prod_rt.engine.connect() as conn:
        committed = conn.execute(
            sa.select(sa.func.count())
            .select_from(usage)
            .where(usage.c.run_id.in_(ids), usage.c.committed.is_(True))
        ).scalar_one()
    assert committed == 3 * len(ids)  # each round committed once, alpha's late commits refused
