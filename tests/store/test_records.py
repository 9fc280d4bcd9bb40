"""The store's contract for what a run appends (``shared.store.records``), on SQLite and
PostgreSQL: messages numbered as given, events in order from a seq, usage rows."""

from __future__ import annotations

import sqlalchemy as sa

from shared.agent.messages import Message, ToolCall
from shared.engine.runtime import Runtime
from shared.store import records
from shared.store.tables import usage

TS = 1_800_000_000.0


def _run(rt: Runtime, run_id: str) -> None:
    row = {"id": run_id, "tenant": "t1", "kind": "agent", "status": "running"}
    with rt.engine.begin() as conn:
        rt.store.insert_run(conn, row, {"agent": {"kind": "agent"}}, [], TS)


def test_messages_keep_their_fields_and_order(rt: Runtime) -> None:
    _run(rt, "run_m")
    call = ToolCall(id="c1", name="echo", arguments='{"text": "x"}')
    msgs = [
        (Message(role="assistant", content="", tool_calls=(call,), reasoning="why"), 1),
        (Message(role="tool", content="x", tool_call_id="c1", name="echo"), 1),
    ]
    with rt.engine.begin() as conn:
        records.insert_messages(conn, "run_m", 1, msgs, TS, records.message_tokens(msgs))
    with rt.engine.connect() as conn:
        rows = records.own_messages(conn, "run_m")
        later = records.own_messages(conn, "run_m", 2)
        listed = records.list_messages(conn, "run_m")
    assert [r["seq"] for r in rows] == [1, 2] and [r["seq"] for r in later] == [2]
    assert rows[0]["tool_calls"] == [call.to_dict()] and rows[0]["reasoning"] == "why"
    assert rows[1]["tool_call_id"] == "c1" and rows[1]["tokens"] > 0
    assert [r["seq"] for r in listed] == [1, 2]


def test_events_are_numbered_from_their_seq_and_read_after_one(rt: Runtime) -> None:
    _run(rt, "run_e")
    with rt.engine.begin() as conn:
        numbered = records.insert_events(conn, "run_e", 1, [("a.b", {"x": 1}), ("c.d", {})], TS)
    assert [(s, t) for s, t, _ in numbered] == [(1, "a.b"), (2, "c.d")]
    with rt.engine.connect() as conn:
        after = records.list_events(conn, "run_e", after=1)
        typed = records.list_events_of(conn, "run_e", ["a.b"])
    assert [e["seq"] for e in after] == [2] and [e["data"] for e in typed] == [{"x": 1}]


def test_usage_rows_are_appended(rt: Runtime) -> None:
    _run(rt, "run_u")
    row = {"round": 1, "purpose": "round", "input_tokens": 10, "output_tokens": 5, "cost": 0.5}
    with rt.engine.begin() as conn:
        records.insert_usage(conn, "run_u", [row, {**row, "committed": False}], TS)
    with rt.engine.connect() as conn:
        got = conn.execute(
            sa.select(usage.c.cost, usage.c.committed).where(usage.c.run_id == "run_u")
        ).all()
    assert sorted(got) == [(0.5, False), (0.5, True)]
