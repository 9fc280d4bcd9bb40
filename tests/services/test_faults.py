"""Real faults: a row lock held by a stalled session, Redis and PostgreSQL unreachable,
database sessions killed. Waits are bounded, a write runs once, the API answers 503 JSON
(never a plain-text 500) and recovers without a single 5xx."""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from scheduler.app import create_app
from scheduler.embedded import ReaperLoop
from shared.config import Settings
from shared.engine.runtime import Dispatch, Runtime
from shared.llm.ratelimit import RedisLimiter
from shared.names import REAPER_QUEUE, ROUNDS_QUEUE, TOOLS_QUEUE
from shared.store.db import PgLimits, lock_busy, make_engine, migrate
from tests.support import EffectServer, WorkerProcs, quick_recovery, record_tool, wait_for

CLOSED = "127.0.0.1:9"  # nothing listens on the discard port here


def test_postgres_sessions_have_bounded_waits(pg_url: str) -> None:
    engine = make_engine(pg_url)
    try:
        with engine.connect() as conn:
            shown = {
                name: conn.exec_driver_sql(f"SHOW {name}").scalar()
                for name in (
                    "lock_timeout",
                    "statement_timeout",
                    "idle_in_transaction_session_timeout",
                )
            }
            fd = conn.connection.dbapi_connection.pgconn.socket  # type: ignore[union-attr]
            with socket.socket(fileno=os.dup(fd)) as sock:
                keepalive = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE)
                probes = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT)
        assert shown == {
            "lock_timeout": "5s",
            "statement_timeout": "30s",
            "idle_in_transaction_session_timeout": "10s",
        }
        assert (keepalive, probes) == (10, 3)  # a partitioned peer is found in 25 s
    finally:
        engine.dispose()


def test_a_held_row_lock_fails_fast_as_busy(pg_url: str, pg_engine: sa.engine.Engine) -> None:
    """A statement behind a lock gives up after lock_timeout, and is recognised as busy."""
    quick = make_engine(pg_url, limits=PgLimits(lock_timeout=0.5))
    try:
        with pg_engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE IF NOT EXISTS t_lock (id int primary key)")
            conn.exec_driver_sql("INSERT INTO t_lock VALUES (1) ON CONFLICT DO NOTHING")
        with pg_engine.begin() as holder:
            holder.exec_driver_sql("SELECT * FROM t_lock WHERE id = 1 FOR UPDATE")
            started = time.monotonic()
            with pytest.raises(sa.exc.OperationalError) as caught, quick.begin() as conn:
                conn.exec_driver_sql("UPDATE t_lock SET id = 1 WHERE id = 1")
            assert time.monotonic() - started < 3
            assert lock_busy(caught.value)
    finally:
        quick.dispose()
        with pg_engine.begin() as conn:
            conn.exec_driver_sql("DROP TABLE IF EXISTS t_lock")


def test_a_session_paused_in_a_transaction_loses_its_locks(
    pg_url: str, pg_engine: sa.engine.Engine
) -> None:
    """A worker stopped mid-transaction (SIGSTOP, a partition) holds its row locks only until
    idle_in_transaction_session_timeout: then the server ends its session."""
    paused = make_engine(pg_url, limits=PgLimits(idle_in_transaction=1.0))
    try:
        with pg_engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE IF NOT EXISTS t_idle (id int primary key)")
            conn.exec_driver_sql("INSERT INTO t_idle VALUES (1) ON CONFLICT DO NOTHING")
        conn = paused.connect()
        conn.exec_driver_sql("SELECT * FROM t_idle WHERE id = 1 FOR UPDATE")
        started = time.monotonic()
        with pg_engine.begin() as other:  # waits at most ~1 s, then gets the row
            other.exec_driver_sql("UPDATE t_idle SET id = 1 WHERE id = 1")
        assert time.monotonic() - started < 4
        with pytest.raises(sa.exc.DBAPIError):
            conn.exec_driver_sql("SELECT 1")
        conn.invalidate()
    finally:
        paused.dispose()
        with pg_engine.begin() as c:
            c.exec_driver_sql("DROP TABLE IF EXISTS t_idle")


# --- a write behind a held lock runs once --------------------------------------------------


@pytest.fixture
def effects() -> Iterator[EffectServer]:
    with EffectServer() as server:
        yield server


@pytest.fixture
def fast_recovery(effects: EffectServer) -> dict[str, str]:
    return quick_recovery(f"127.0.0.1:{effects.port}", TREADLE_DB_LOCK_TIMEOUT="1")


def _write_agent(url: str) -> dict[str, object]:
    return {
        "kind": "agent",
        "tools": [record_tool(url)],
        "model": {
            "provider": "scripted",
            "replies": [
                {"tool_calls": [{"id": "w1", "name": "record", "arguments": {"item": "A"}}]},
                {"text": "Recorded A."},
            ],
        },
    }


def test_resent_claims_behind_a_held_lock_run_the_write_once(
    prod_rt: Runtime, workers: WorkerProcs, effects: EffectServer
) -> None:
    """The run's row is locked by a stalled session while 10 re-sent claims of its write
    arrive: each gives up after lock_timeout (no thread parks), and once the lock is gone the
    write runs once — the endpoint sees one request, one effect."""
    workers.start("rounds", concurrency=2, queues=f"{ROUNDS_QUEUE},{REAPER_QUEUE}")
    with TestClient(create_app(lambda: prod_rt)) as client:
        run = client.post(
            "/v1/runs", json={"agent": _write_agent(effects.url), "input": "record A"}
        ).json()
        run_id = run["id"]

        def queued() -> int | None:
            with prod_rt.engine.connect() as conn:
                row = conn.exec_driver_sql(
                    "SELECT r.version FROM tool_calls c JOIN runs r ON r.id = c.run_id "
                    "WHERE c.run_id = %s AND c.status = 'queued'",
                    (run_id,),
                ).first()
            return None if row is None else int(row[0])

        version = wait_for(queued, 30, what="the write queued")
        stalled = make_engine(prod_rt.settings.database_url, limits=PgLimits(idle_in_transaction=0))
        with stalled.begin() as holder:  # a stalled session holds the run's row (no timeout)
            holder.exec_driver_sql("SELECT id FROM runs WHERE id = %s FOR UPDATE", (run_id,))
            prod_rt.publish([Dispatch.tool(run_id, "w1", version)] * 10)
            name = workers.start("tools", concurrency=4, queues=TOOLS_QUEUE)
            took = wait_for(
                lambda: len(x := _task_seconds(workers.log(name))) >= 11 and x,
                30,
                what="the 11 deliveries done",
            )
            # all 11 ended while the row is still held: none waited for it (lock_timeout 1 s,
            # plus a cold worker's first tasks on a busy machine)
            assert max(took) < 5.0, took
            assert "held elsewhere" in workers.log(name)
            time.sleep(3.5)  # longer than the lease: a claim that waited would now be stale
            assert effects.hits == {}
        stalled.dispose()
        reaper = ReaperLoop(prod_rt, 0.5).start()
        try:
            done = wait_for(
                lambda: (
                    (x := client.get(f"/v1/runs/{run_id}").json())["status"] == "completed" and x
                ),
                60,
                what="the run completed",
            )
        finally:
            reaper.stop()
    assert done["result"]["text"] == "Recorded A."
    assert list(effects.effects.values()) == [1]
    assert list(effects.hits.values()) == [1]


def _task_seconds(log: str) -> list[float]:
    return [float(m) for m in re.findall(r"treadle\.tool\[[^]]+\] succeeded in ([0-9.]+)s", log)]


# --- degrade: 503 JSON with Retry-After ----------------------------------------------------


def _client(rt: Runtime) -> TestClient:
    return TestClient(create_app(lambda: rt, auth="off"), raise_server_exceptions=False)


def _agent() -> dict[str, object]:
    return {"kind": "chat", "model": {"provider": "scripted", "replies": [{"text": "hi"}]}}


@pytest.mark.parametrize("mode", ["open", "closed"])
def test_redis_unreachable_submit_follows_the_limiter_setting(
    sqlite_rt: Runtime, mode: str
) -> None:
    settings = sqlite_rt.settings.model_copy(
        update={"limiter_on_failure": mode, "submits_per_minute": 100}
    )
    rt = dataclasses.replace(
        sqlite_rt, settings=settings, limiter=RedisLimiter(f"redis://{CLOSED}/0")
    )
    with _client(rt) as client:
        r = client.post("/v1/runs", json={"agent": _agent(), "input": "hello"})
    if mode == "open":
        assert r.status_code == 201, r.text
    else:
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "unavailable"
        assert int(r.headers["Retry-After"]) > 0


def test_database_unreachable_is_503_json(tmp_path: Path) -> None:
    engine = make_engine(f"postgresql+psycopg://postgres@{CLOSED}/none")
    settings = Settings(database_url=str(engine.url), broker_url="memory://", auth="off")
    rt = Runtime(engine=engine, settings=settings, publish=lambda items: None)
    with _client(rt) as client:
        for r in (
            client.get("/v1/runs/run_nope"),
            client.get("/v1/runs"),
            client.post("/v1/runs", json={"agent": _agent(), "input": "hello"}),
        ):
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "unavailable"
            assert r.headers["Retry-After"] == "5"
    engine.dispose()


def test_killed_database_sessions_cost_no_request(pg_url: str, pg_engine: sa.engine.Engine) -> None:
    """Every pooled connection of the API is killed (as by a database restart): the next
    requests all succeed (the pool tests each connection before use)."""
    engine = make_engine(pg_url)
    migrate(engine)
    settings = Settings(database_url=pg_url, broker_url="memory://", auth="off")
    rt = Runtime(engine=engine, settings=settings, publish=lambda items: None)
    statuses: list[int] = []
    with _client(rt) as client:
        created = client.post("/v1/runs", json={"agent": _agent(), "input": "hello"})
        assert created.status_code == 201, created.text
        run_id = created.json()["id"]
        for _ in range(5):
            assert client.get(f"/v1/runs/{run_id}").status_code == 200
        with pg_engine.connect() as admin:
            killed = admin.exec_driver_sql(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).scalar()
            admin.commit()
        assert killed and killed >= 1
        for _ in range(10):
            statuses.append(client.get(f"/v1/runs/{run_id}").status_code)
            statuses.append(client.get("/v1/runs").status_code)
    engine.dispose()
    assert statuses == [200] * 20


# --- observability: the worker's own flags ------------------------------------------------


@pytest.mark.parametrize("events", [False, True])
def test_treadle_worker_logs_at_the_level_and_sends_events_only_when_asked(
    monkeypatch: pytest.MonkeyPatch, events: bool
) -> None:
    from typer.testing import CliRunner

    from scheduler.cli.main import app
    from shared.celery_app import app as celery_app
    from shared.config import reset_settings

    seen: list[list[str]] = []
    monkeypatch.setattr(celery_app, "worker_main", lambda argv: seen.append(list(argv)))
    monkeypatch.setenv("TREADLE_LOG_LEVEL", "info")
    monkeypatch.setenv("TREADLE_TASK_EVENTS", str(events).lower())
    reset_settings()
    try:
        result = CliRunner().invoke(app, ["worker", "-c", "2"])
    finally:
        reset_settings()
    assert result.exit_code == 0, result.output
    argv = seen[0]
    assert argv[argv.index("-l") + 1] == "INFO"
    assert ("-E" in argv) is events
    assert REAPER_QUEUE in argv[argv.index("-Q") + 1].split(",")
