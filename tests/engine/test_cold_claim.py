"""A cold claim (``RunCaches.cold``: the process holds nothing of the run, as after a
pause, at a run's first round or on a takeover) reads the run's spec and messages in the claim's
own statement on PostgreSQL (``Prefetch``), and the caches take them only when they reach
the row's ``msg_seq``."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import sqlalchemy as sa

from shared.engine.round import run_round
from shared.engine.runtime import Runtime
from shared.store import runs as run_store
from tests.engine.helpers import agent, submit


@pytest.fixture
def pg_rt(sqlite_rt: Runtime, pg_engine: sa.engine.Engine) -> Iterator[Runtime]:
    yield replace(sqlite_rt, engine=pg_engine)


def _statements(engine: sa.engine.Engine) -> tuple[list[str], Any]:
    seen: list[str] = []

    def before(_c: Any, _cur: Any, statement: str, *_a: Any) -> None:
        seen.append(" ".join(statement.split()))

    sa.event.listen(engine, "before_cursor_execute", before)
    return seen, before


def test_a_cold_round_reads_nothing_beside_its_claim(pg_rt: Runtime) -> None:
    run_id = submit(pg_rt, agent([{"text": "done"}], system_prompt="Be brief."))
    pg_rt.caches.forget([run_id])
    seen, hook = _statements(pg_rt.engine)
    try:
        dispatch = pg_rt.publish.sent[-1]  # type: ignore[attr-defined]
        assert run_round(pg_rt, run_id, dispatch.version).status == "committed"
    finally:
        sa.event.remove(pg_rt.engine, "before_cursor_execute", hook)
    reads = [s for s in seen if s.startswith("SELECT") and "FROM run_specs" in s.split(" WHERE")[0]]
    assert reads == []  # the spec came with the claim
    assert not any(s.startswith("SELECT") and "FROM messages" in s for s in seen)
    with pg_rt.engine.connect() as conn:
        run = run_store.load_run(conn, run_id)
    assert run is not None and run.status.value == "completed"


def test_messages_short_of_the_rows_msg_seq_are_not_cached(pg_rt: Runtime) -> None:
    run_id = submit(pg_rt, agent([{"text": "done"}], system_prompt="Be brief."))
    pg_rt.caches.forget([run_id])
    with pg_rt.engine.begin() as conn:
        run = run_store.load_run(conn, run_id)
        assert run is not None
        claimed = pg_rt.store.claim_round(
            conn, run_id, run.version, "w1", run_store.now(), run_store.now() - 30, cold=True
        )
    assert claimed is not None
    new, pre = claimed.run, claimed.prefetched
    assert pre is not None and pre.messages
    pg_rt.caches.prime(new, replace(pre, messages=pre.messages[:-1]))  # as if a commit raced it
    assert pg_rt.caches.views.get(run_id) is None
    assert pg_rt.caches.specs.get(run_id) is not None  # the spec is what the row's revision says
    pg_rt.caches.forget([run_id])
    pg_rt.caches.prime(new, pre)
    view = pg_rt.caches.views.get(run_id)
    assert view is not None and view.seen == new.msg_seq
    with pg_rt.engine.connect() as conn:
        read = pg_rt.caches.history(conn, run_id, new.view_start, new.msg_seq, based=False)
    assert [m.role for m in read] == [m.role for m in view.messages]
    pg_rt.caches.forget([run_id])


def test_the_cached_view_keeps_its_call_ids(pg_rt: Runtime) -> None:
    spec = agent(
        [
            {"tool_calls": [{"id": "c1", "name": "echo", "arguments": {"text": "a"}}]},
            {"tool_calls": [{"id": "c2", "name": "echo", "arguments": {"text": "b"}}]},
            {"text": "done"},
        ],
        tools=["echo"],
    )
    run_id = submit(pg_rt, spec)
    pg_rt.publish.drain(pg_rt)  # type: ignore[attr-defined]
    with pg_rt.engine.connect() as conn:
        run = run_store.load_run(conn, run_id)
        assert run is not None
        pg_rt.caches.forget([run_id])
        history = pg_rt.caches.history(conn, run_id, run.view_start, run.msg_seq, based=False)
    assert pg_rt.caches.call_ids(run_id, run.view_start, run.msg_seq) == {"c1", "c2"}
    assert {c.id for m in history for c in m.tool_calls} == {"c1", "c2"}
    assert pg_rt.caches.call_ids(run_id, run.view_start, run.msg_seq - 1) is None  # another view
    pg_rt.caches.forget([run_id])
