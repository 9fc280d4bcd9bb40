"""Scheduled runs and crons through real Celery workers on Redis + PostgreSQL, with the
reaper's pass running in a loop as ``treadle beat`` would: a ``delay_s: 5`` run holds no broker
message while scheduled and starts between 5 s and 5 s + the reaper interval later; two
processes firing one cron concurrently over several slots never fire a slot twice."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
import sqlalchemy as sa
from fastapi.testclient import TestClient

from scheduler.app import create_app
from shared.engine import commands, schedule
from shared.engine.reaper import reap
from shared.engine.runtime import Runtime
from shared.store import runs as run_store
from shared.store import schedules as store
from shared.store.tables import cron_fires, events
from tests.support import WorkerProcs, wait_for

REAPER_INTERVAL = 1.0
CHAT = {"kind": "chat", "model": {"provider": "scripted", "replies": [{"text": "hi"}]}}


@contextmanager
def reaper_loop(rt: Runtime, interval: float = REAPER_INTERVAL) -> Iterator[None]:
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval):
            reap(rt)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join(10)


def _broker_messages(rt: Runtime) -> int:
    r = redis.Redis.from_url(rt.settings.broker_url)
    p = rt.settings.broker_prefix
    keys = [k for q in ("treadle.rounds", "treadle.tools") for k in r.keys(f"{p}{q}*")]
    return sum(int(r.llen(k)) for k in keys) + int(r.hlen(f"{p}unacked"))


def _started_at(rt: Runtime, run_id: str) -> float | None:
    q = sa.select(sa.func.min(events.c.created_at)).where(
        events.c.run_id == run_id, events.c.type == "round.started"
    )
    with rt.engine.connect() as conn:
        found = conn.execute(q).scalar()
    return float(found) if found is not None else None


def test_a_delayed_run_starts_on_time_holding_no_message(
    prod_rt: Runtime, workers: WorkerProcs
) -> None:
    workers.start("alpha", concurrency=2)
    with TestClient(create_app(lambda: prod_rt)) as client, reaper_loop(prod_rt):
        submitted = time.time()
        run = client.post("/v1/runs", json={"agent": CHAT, "input": "hi", "delay_s": 5}).json()
        assert run["status"] == "scheduled" and run["run_at"]
        while time.time() - submitted < 4.5:
            assert _broker_messages(prod_rt) == 0
            assert client.get(f"/v1/runs/{run['id']}").json()["status"] == "scheduled"
            time.sleep(0.25)
        wait_for(
            lambda: client.get(f"/v1/runs/{run['id']}").json()["status"] == "completed",
            30,
            what="the delayed run completes",
        )
    started = _started_at(prod_rt, run["id"])
    assert started is not None
    late = started - submitted
    print(f"\ndelay_s=5: first round started after {late:.2f} s (reaper every {REAPER_INTERVAL} s)")
    assert 5.0 <= late <= 5.0 + REAPER_INTERVAL + 1.0


def _cron(rt: Runtime) -> str:
    row: dict[str, Any] = {
        "id": commands.new_id("cron"),
        "tenant": "default",
        "agent": {"spec": CHAT, "ref": None},
        "input": "tick",
        "schedule": "* * * * *",
        "timezone": "UTC",
        "next_fire": 0.0,
    }
    with rt.engine.begin() as conn:
        return store.insert_cron(conn, row, run_store.now()).id


def test_two_processes_never_fire_a_slot_twice(prod_rt: Runtime) -> None:
    # a fake clock: minute slots, each fired by two reapers at once, several times
    cron_id = _cron(prod_rt)
    base = (int(time.time()) // 60) * 60
    fired: list[int] = []
    lock = threading.Lock()
    for minute in range(6):
        now = base + 60 * minute + 1.0
        barrier = threading.Barrier(2)

        def fire(at: float = now, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            n = schedule.fire_crons(prod_rt, at)
            with lock:
                fired.append(n)

        threads = [threading.Thread(target=fire) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert sum(fired) == 6, fired
    with prod_rt.engine.connect() as conn:
        slots = conn.execute(
            sa.select(cron_fires.c.slot, cron_fires.c.run_id).where(cron_fires.c.cron_id == cron_id)
        ).all()
    assert len(slots) == 6 and all(run_id for _, run_id in slots)
    # down for four minutes: one catch-up run, then the next slot as usual
    later = base + 60 * 10 + 1.0
    assert schedule.fire_crons(prod_rt, later) + schedule.fire_crons(prod_rt, later) == 1
    with prod_rt.engine.connect() as conn:
        cron = store.get_cron(conn, cron_id)
    assert cron is not None and cron.last_slot == base + 600 and cron.next_fire == base + 660
