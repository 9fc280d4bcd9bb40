"""Chaos: runs survive SIGKILLed workers, a flushed broker and a restarted database with no
duplicate round, no lost run and exactly one effect per tool call.

N runs of scripted multi-round tool use; 3 real worker processes; a killer thread SIGKILLs a
random worker at random moments (mid model call, mid tool, mid join) and starts a new one;
the broker loses every queued message once (Redis flushed, RabbitMQ's queues purged) and
PostgreSQL is restarted once mid-storm. Afterwards every run must be completed with exactly
the fault-free transcript. On Redis (50 runs, 20 kills: ``CHAOS_RUNS``, ``CHAOS_KILLS``) and on
RabbitMQ (a smaller storm: 20 runs, 8 kills; ``CHAOS_RABBIT_RUNS``, ``CHAOS_RABBIT_KILLS``).
Under CI=true (a loaded machine) the storms are shorter: 30 runs and 8 kills on Redis, 15
runs and 5 kills on RabbitMQ; the variables still set any size.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa
from fastapi.testclient import TestClient
from kombu import Connection

from scheduler.app import create_app
from scheduler.embedded import ReaperLoop
from shared.engine.runtime import Runtime
from shared.names import ALL_QUEUES
from shared.store.tables import messages, outbox, runs, usage
from tests.support import (
    IN_CI,
    EffectServer,
    WorkerProcs,
    knob,
    model_calls,
    need_service,
    record_tool,
    wait_for,
)

# full sizes by default; under CI=true a shorter storm (still several SIGKILLs, the broker
# emptied and PostgreSQL restarted part-way); each figure has its variable
RUNS = int(knob("CHAOS_RUNS", 50, 30))
MIN_KILLS = int(knob("CHAOS_KILLS", 20, 8))
RABBIT_RUNS = int(knob("CHAOS_RABBIT_RUNS", 20, 15))
RABBIT_KILLS = int(knob("CHAOS_RABBIT_KILLS", 8, 5))
RABBIT = os.environ.get("TREADLE_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672")
WORKERS = 3


# Both brokers by default; ``CHAOS_BROKERS=redis`` (or ``rabbitmq``) runs one. A differing
# transcript is printed whole, so a failure in CI shows what the run said.
BROKERS = os.environ.get("CHAOS_BROKERS", "redis,rabbitmq").split(",")


@pytest.fixture(params=BROKERS)
def broker(request: pytest.FixtureRequest, redis_url: str) -> Iterator[str]:
    """The broker's URL: the session's Redis database, or a fresh RabbitMQ vhost."""
    if request.param == "redis":
        yield redis_url
        return
    vhost = f"treadle_t_{uuid.uuid4().hex[:8]}"
    try:
        if shutil.which("rabbitmqctl"):
            _rabbitmqctl("add_vhost", vhost)
            _rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
        else:
            vhost = ""  # the default vhost
        url = f"{RABBIT}/{vhost}"
        with Connection(url, connect_timeout=3) as conn:
            conn.ensure_connection(max_retries=1)
    except Exception as exc:
        need_service("RabbitMQ", exc)
    yield url
    if vhost:
        _rabbitmqctl("delete_vhost", vhost)


def _rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", *args], check=True, capture_output=True, timeout=60)


def _scale(broker: str) -> tuple[int, int]:
    """Runs and kills of the storm on this broker."""
    return (RABBIT_RUNS, RABBIT_KILLS) if broker.startswith("amqp") else (RUNS, MIN_KILLS)


@pytest.fixture
def effects() -> Iterator[EffectServer]:
    with EffectServer(delay=0.15) as server:
        yield server


@pytest.fixture
def fast_recovery(effects: EffectServer, broker: str) -> dict[str, str]:
    return {
        "TREADLE_LEASE_SECONDS": "3",
        "TREADLE_REDRIVE_SECONDS": "2",
        "TREADLE_ALLOW_HOSTS": f"127.0.0.1:{effects.port}",
        "TREADLE_BROKER_URL": broker,
    }


def _agent(i: int, effects: EffectServer) -> dict[str, Any]:
    def rec(cid: str, item: str) -> dict[str, Any]:
        return {"id": cid, "name": "record", "arguments": {"item": item}}

    replies = [
        {"sleep": 0.3, "text": "", "tool_calls": [rec("a", f"{i}-a"), rec("b", f"{i}-b")]},
        {"sleep": 0.3, "text": "", "tool_calls": [rec("c", f"{i}-c")]},
        {"sleep": 0.3, "text": f"run {i} done"},
    ]
    return {
        "kind": "agent",
        "tools": [record_tool(effects.url)],
        "parallel_tools": 2,
        "model": {"provider": "scripted", "replies": replies},
    }


def _expected(i: int, text: str) -> list[tuple[str, str, list[str]]]:
    def res(x: str) -> str:
        return json.dumps({"recorded": f"{i}-{x}"})

    return [
        ("user", text, []),
        ("assistant", "", ["a", "b"]),
        ("tool", res("a"), []),
        ("tool", res("b"), []),
        ("assistant", "", ["c"]),
        ("tool", res("c"), []),
        ("assistant", f"run {i} done", []),
    ]


class Storm:
    """Kills random workers at random moments and replaces them; empties the broker and
    restarts PostgreSQL once each, part-way through (after a third and two thirds of the
    kills)."""

    def __init__(self, workers: WorkerProcs, broker: str, seed: int, kills: int) -> None:
        self.workers, self.broker = workers, broker
        self.flush_at, self.restart_at = max(1, kills // 3), max(2, 2 * kills // 3)
        self.rng = random.Random(seed)
        self.kills = 0
        self.flushed = self.pg_restarted = False
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self.stop.wait(self.rng.uniform(0.4, 1.4)):
            live = list(self.workers.procs)
            if live:
                self.workers.kill(self.rng.choice(live))
                self.kills += 1
            while len(self.workers.procs) < WORKERS and not self.stop.is_set():
                self.workers.start(concurrency=8)
            if self.kills >= self.flush_at and not self.flushed:
                empty_broker(self.broker)
                self.flushed = True
            if self.kills >= self.restart_at and not self.pg_restarted:
                self.pg_restarted = restart_postgres()


def empty_broker(url: str) -> None:
    """Every message waiting in the broker is lost (Redis FLUSHDB, RabbitMQ queue purge)."""
    if url.startswith("redis"):
        redis.Redis.from_url(url).flushdb()
        return
    with Connection(url, connect_timeout=3) as conn:
        channel: Any = conn.channel()
        for queue in ALL_QUEUES:
            try:
                channel.queue_purge(queue)
            except Exception:  # not declared (yet): nothing in it
                channel = conn.channel()


def restart_postgres() -> bool:
    """Restart the local PostgreSQL cluster (needs pg_ctlcluster, as on CI machines)."""
    if not shutil.which("pg_ctlcluster") or not Path("/etc/postgresql").is_dir():
        if IN_CI:
            raise AssertionError("pg_ctlcluster is needed to restart PostgreSQL in CI")
        return False
    version = sorted(os.listdir("/etc/postgresql"))[0]
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return True


def _transcript(conn: sa.Connection, run_id: str) -> list[tuple[str, str, list[str]]]:
    rows = (
        conn.execute(
            sa.select(messages).where(messages.c.run_id == run_id).order_by(messages.c.seq)
        )
        .mappings()
        .all()
    )
    return [(m["role"], m["content"], [c["id"] for c in m["tool_calls"] or []]) for m in rows]


def test_chaos(
    prod_rt: Runtime, workers: WorkerProcs, effects: EffectServer, call_log: Path, broker: str
) -> None:
    runs_n, min_kills = _scale(broker)
    workers.start_many([None] * WORKERS, concurrency=8)
    reaper = ReaperLoop(prod_rt, 0.5).start()
    seed = int(os.environ.get("CHAOS_SEED", "7"))
    storm = Storm(workers, broker, seed, min_kills)
    started = time.monotonic()
    try:
        with TestClient(create_app(lambda: prod_rt)) as client:
            ids = [
                client.post(
                    "/v1/runs", json={"agent": _agent(i, effects), "input": f"chaos {i}"}
                ).json()["id"]
                for i in range(runs_n)
            ]
            storm.thread.start()
            wait_for(
                lambda: storm.kills >= min_kills and storm.flushed,
                240,
                interval=0.5,
                what="the storm",
            )
            storm.stop.set()
            storm.thread.join(60)
            while len(workers.procs) < WORKERS:
                workers.start(concurrency=8)
            wait_for(
                lambda: _completed(prod_rt) == runs_n,
                240,
                interval=0.5,
                what=f"all {runs_n} runs completed",
            )
    finally:
        storm.stop.set()
        reaper.stop()
    elapsed = time.monotonic() - started
    _check(prod_rt, ids, effects, call_log, storm, elapsed, min_kills)


def _completed(rt: Runtime) -> int:
    try:
        with rt.engine.connect() as conn:
            return int(
                conn.execute(
                    sa.select(sa.func.count()).select_from(runs).where(runs.c.status == "completed")
                ).scalar_one()
            )
    except sa.exc.OperationalError:
        return -1


def _check(
    rt: Runtime,
    ids: list[str],
    effects: EffectServer,
    call_log: Path,
    storm: Storm,
    elapsed: float,
    min_kills: int,
) -> None:
    dup_rounds = lost = mismatched = 0
    with rt.engine.connect() as conn:
        for i, run_id in enumerate(ids):
            status = conn.execute(sa.select(runs.c.status).where(runs.c.id == run_id)).scalar()
            lost += status != "completed"
            committed = conn.execute(
                sa.select(sa.func.count())
                .select_from(usage)
                .where(usage.c.run_id == run_id, usage.c.committed.is_(True))
            ).scalar_one()
            dup_rounds += max(0, committed - 3)
            got = _transcript(conn, run_id)
            if got != _expected(i, f"chaos {i}"):
                mismatched += 1
                print(f"\nchaos: run {run_id} transcript differs: {got}")
        leftover = conn.execute(sa.select(sa.func.count()).select_from(outbox)).scalar_one()
        abandoned = conn.execute(
            sa.select(sa.func.count()).select_from(usage).where(usage.c.committed.is_(False))
        ).scalar_one()
    expected_keys = {f"{run_id}:{c}" for run_id in ids for c in "abc"}
    dup_effects = sum(n - 1 for n in effects.effects.values() if n > 1)
    print(
        f"\nchaos ({storm.broker.split(':', 1)[0]}): runs={len(ids)} "
        f"completed={len(ids) - lost} kills={storm.kills} "
        f"duplicate_rounds={dup_rounds} duplicate_effects={dup_effects} lost={lost} "
        f"broker_emptied={storm.flushed} pg_restarted={storm.pg_restarted} "
        f"model_calls={len(model_calls(call_log))} abandoned_calls_billed={abandoned} "
        f"tool_requests={sum(effects.hits.values())} seconds={elapsed:.0f}"
    )
    assert lost == 0 and dup_rounds == 0 and mismatched == 0
    assert set(effects.effects) == expected_keys and dup_effects == 0
    assert leftover == 0, "nothing may stay scheduled after every run completed"
    assert storm.kills >= min_kills and storm.flushed
    assert storm.pg_restarted or not IN_CI
