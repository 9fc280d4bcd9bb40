"""A tool call's commit is fenced by its attempt, also when the call is its round's only one
and closes in the join's own statement (``shared.engine.join``): a worker whose call was
taken over commits nothing, neither the call nor the run; the holder's commit joins. On
SQLite and PostgreSQL."""

from __future__ import annotations

from shared.agent.spec import AgentSpec
from shared.engine import toolrun
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.store import calls as call_store
from shared.store import records
from shared.store.rows import Call, CallStatus, Run
from shared.tools.base import ToolResult

from .conftest import LocalServer
from .test_read_claims import _queued


def _loaded(rt: Runtime, run_id: str) -> tuple[Run, Call, AgentSpec]:
    """The run, its call ``c1`` and the agent serving it."""
    with rt.engine.connect() as conn:
        found = call_store.call_and_run(conn, run_id, "c1")
        assert found is not None
        run, call = found
        spec = rt.caches.given(conn, run_id, run.spec_rev).serving(run.loop)
    return run, call, spec


def _tool_texts(rt: Runtime, run_id: str) -> list[str]:
    with rt.engine.connect() as conn:
        return [m["content"] for m in records.list_messages(conn, run_id) if m["role"] == "tool"]


def test_a_taken_over_call_commits_nothing_and_the_holder_joins(
    any_rt: Runtime, stub: StubBroker, server: LocalServer
) -> None:
    rt, run_id, _ = _queued(any_rt, stub, server, "/item", read_only=False)
    run, call, spec = _loaded(rt, run_id)
    mine = toolrun._claim(rt, run, call)
    assert mine is not None and mine.attempts == 1
    with rt.engine.begin() as conn:  # another worker takes it over: attempt 2
        call_store.set_calls(conn, run_id, ["c1"], {"attempts": 2})
    run, _, _ = _loaded(rt, run_id)

    assert toolrun._commit(rt, spec, run, mine, ToolResult(text="late")) == "lost"
    after, now, _ = _loaded(rt, run_id)
    assert (after.version, after.open_calls) == (run.version, 1)
    assert now.status == CallStatus.RUNNING and now.result is None
    assert _tool_texts(rt, run_id) == []

    assert toolrun._commit(rt, spec, run, now, ToolResult(text="the holder's")) == "committed"
    after, done, _ = _loaded(rt, run_id)
    assert done.status == CallStatus.DONE and done.result == "the holder's"
    assert after.open_calls == 0 and after.version > run.version
    assert _tool_texts(rt, run_id) == ["the holder's"]
