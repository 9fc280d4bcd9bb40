"""The search's filters in the store, on SQLite and PostgreSQL: agent names (any version, a
LIKE wildcard in a name is literal), the end-time range, suspended runs, and the threads'
metadata search the LangGraph facade uses."""

from __future__ import annotations

from shared.agent.spec import AgentSpec
from shared.engine import commands
from shared.engine.runtime import Runtime
from shared.store import runs as run_store
from shared.store import threads as thread_store
from shared.store.runs import RunFilter

CHAT = AgentSpec.model_validate(
    {"kind": "chat", "model": {"provider": "scripted", "replies": [{"text": "Hi."}]}}
)


def _submit(rt: Runtime, ref: str | None) -> str:
    row, _ = commands.submit_run(rt, commands.RunInput(agent=CHAT, input="hi", agent_ref=ref))
    return str(row.id)


def test_agent_and_end_filters(rt: Runtime) -> None:
    bot1, bot2, other, bare = (_submit(rt, r) for r in ("bot@1", "bot@2", "b_x@1", "bot"))
    commands.cancel_run(rt, "default", bot2)
    with rt.engine.connect() as conn:
        ended = run_store.get_run(conn, bot2)
        assert ended is not None and ended.run.ended_at is not None

        def ids(f: RunFilter) -> set[str]:
            return {r.id for r in run_store.search_runs(conn, "default", f, limit=50)}

        assert ids(RunFilter(agent="bot")) == {bot1, bot2, bare}
        assert ids(RunFilter(agent="b_t")) == set()  # "_" is not a wildcard
        assert ids(RunFilter(agent="b_x")) == {other}
        assert ids(RunFilter(ended_after=ended.run.ended_at)) == {bot2}
        assert ids(RunFilter(ended_before=ended.run.ended_at)) == set()
        assert ids(RunFilter(statuses=("queued",), agent="bot")) == {bot1, bare}
        assert run_store.matching_ids(conn, "default", RunFilter(agent="bot"), 2) == [bot1, bot2]
        assert ids(RunFilter(suspended=True)) == set()


def test_threads_by_metadata(rt: Runtime) -> None:
    with rt.engine.begin() as conn:
        for i, meta in enumerate([{"user": "u1", "n": 1}, {"user": "u2"}, None]):
            thread_store.insert_thread(conn, {"id": f"thr_{i}", "meta": meta}, 100.0 + i)
        found = thread_store.search_threads(conn, "default", metadata={"user": "u1"})
        assert [t["id"] for t in found] == ["thr_0"]
        every = thread_store.search_threads(conn, "default", ids=["thr_1", "thr_2"])
        assert [t["id"] for t in every] == ["thr_2", "thr_1"]  # most recently updated first
        assert thread_store.search_threads(conn, "other", metadata={"user": "u1"}) == []
