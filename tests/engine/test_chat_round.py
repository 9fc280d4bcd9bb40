"""The round protocol on SQLite with a stub broker (docs/durability.md)."""

from __future__ import annotations

import sqlalchemy as sa

from shared.agent.spec import AgentSpec
from shared.engine import commands
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.store import records
from shared.store import runs as run_store
from shared.store.tables import outbox, usage

CHAT = AgentSpec.model_validate(
    {
        "kind": "chat",
        "system_prompt": "Be brief.",
        "model": {"provider": "scripted", "replies": [{"text": "Paris.", "reasoning": "Easy."}]},
    }
)


def _submit(rt: Runtime, spec: AgentSpec = CHAT, text: str = "Capital of France?", **kw: object):
    row, created = commands.submit_run(rt, commands.RunInput(agent=spec, input=text, **kw))  # type: ignore[arg-type]
    return row


def _run(rt: Runtime, run_id: str):
    with rt.engine.connect() as conn:
        return run_store.get_run(conn, run_id)


def test_chat_run_completes_in_one_round(sqlite_rt: Runtime, stub: StubBroker) -> None:
    row = _submit(sqlite_rt)
    assert row["status"] == "queued"
    assert stub.drain(sqlite_rt) == 1
    run = _run(sqlite_rt, row["id"])
    assert run["status"] == "completed"
    assert run["stop_reason"] == "completed"
    assert run["result"]["text"] == "Paris."
    assert run["round"] == 1 and run["input_tokens"] > 0
    with sqlite_rt.engine.connect() as conn:
        msgs = records.list_messages(conn, row["id"])
        rows = conn.execute(sa.select(usage)).mappings().all()
        assert conn.execute(sa.select(sa.func.count()).select_from(outbox)).scalar() == 0
    assert [(m["role"], m["content"]) for m in msgs] == [
        ("user", "Capital of France?"),
        ("assistant", "Paris."),
    ]
    assert msgs[1]["reasoning"] == "Easy."
    assert len(rows) == 1 and rows[0]["committed"]


def test_duplicate_round_message_runs_once(sqlite_rt: Runtime, stub: StubBroker) -> None:
    row = _submit(sqlite_rt)
    item = stub.pop()
    assert item is not None
    assert stub.deliver(sqlite_rt, item) == "committed"
    assert stub.deliver(sqlite_rt, item) == "stale"  # the same message again
    with sqlite_rt.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(usage)).scalar() == 1
        assert len(records.list_messages(conn, row["id"])) == 2


def test_cancelled_run_round_does_nothing(sqlite_rt: Runtime, stub: StubBroker) -> None:
    row = _submit(sqlite_rt)
    commands.cancel_run(sqlite_rt, "default", row["id"])
    assert stub.drain(sqlite_rt) == 1
    run = _run(sqlite_rt, row["id"])
    assert run["status"] == "cancelled"
    with sqlite_rt.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(usage)).scalar() == 0
        assert len(records.list_messages(conn, row["id"])) == 1


def test_idempotency_key_returns_same_run(sqlite_rt: Runtime, stub: StubBroker) -> None:
    a = _submit(sqlite_rt, idempotency_key="k-1")
    b, created = commands.submit_run(
        sqlite_rt, commands.RunInput(agent=CHAT, input="Capital of France?", idempotency_key="k-1")
    )
    assert not created and b["id"] == a["id"]
    assert len(stub.sent) == 1


def test_events_are_durable_and_ordered(sqlite_rt: Runtime, stub: StubBroker) -> None:
    row = _submit(sqlite_rt)
    stub.drain(sqlite_rt)
    with sqlite_rt.engine.connect() as conn:
        evs = records.list_events(conn, row["id"])
    assert [e["type"] for e in evs] == ["run.queued", "round.started", "run.completed"]
    assert [e["seq"] for e in evs] == [1, 2, 3]
