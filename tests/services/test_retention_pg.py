"""Retention on PostgreSQL: purging 1,000 finished runs gives their space back — after a
VACUUM FULL the database is within 10 % of its size before they were created — in batches of
short transactions. ``RETENTION_RUNS`` sets the number (1,000; 300 under CI=true: still
several batches)."""

from __future__ import annotations

import time

import sqlalchemy as sa

from shared.agent.spec import AgentSpec
from shared.config import Settings
from shared.engine import commands, retention
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.store import runs as run_store
from shared.store.tables import runs
from tests.support import knob, references

N = int(knob("RETENTION_RUNS", 1000, 300))


def _size(engine: sa.engine.Engine) -> int:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM FULL"))
        return int(
            conn.execute(sa.text("SELECT pg_database_size(current_database())")).scalar_one()
        )


def test_purging_runs_gives_the_space_back(pg_url: str, pg_engine: sa.engine.Engine) -> None:
    stub = StubBroker()
    rt = Runtime(engine=pg_engine, settings=Settings(database_url=pg_url), publish=stub)
    spec = AgentSpec.model_validate(
        {
            "kind": "agent",
            "tools": ["echo"],
            "model": {
                "provider": "scripted",
                "replies": [
                    {
                        "tool_calls": [
                            {"id": "e1", "name": "echo", "arguments": {"text": "x" * 500}}
                        ]
                    },
                    {"text": "y" * 2000},
                ],
            },
        }
    )
    before = _size(pg_engine)
    for i in range(N):
        commands.submit_run(rt, commands.RunInput(agent=spec, input=f"task {i} " + "z" * 500))
    stub.drain(rt)
    with pg_engine.connect() as conn:
        done = conn.execute(
            sa.select(sa.func.count()).select_from(runs).where(runs.c.status == "completed")
        ).scalar_one()
    assert done == N
    with pg_engine.connect() as conn:
        sample = {str(i) for i in conn.execute(sa.select(runs.c.id).limit(20)).scalars()}
    full = _size(pg_engine)
    started = time.monotonic()
    report = retention.purge(rt, older_than_s=0.0, now=run_store.now() + 1, max_batches=10_000)
    took = time.monotonic() - started
    after = _size(pg_engine)
    print(
        f"\n{N} runs: database {before / 1e6:.2f} MB empty, {full / 1e6:.2f} MB with them, "
        f"{after / 1e6:.2f} MB after purging ({report.deleted} runs in {took:.1f} s, "
        f"batches of {retention.BATCH}) and VACUUM FULL"
    )
    assert report.deleted == N
    assert references(rt, sample) == {}  # no row of any table names a purged run
    assert full > before
    assert abs(after - before) <= 0.10 * before
