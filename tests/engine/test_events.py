"""The durable event log: every state change and tool start/finish is an event,
written in the transaction of the change; commits wake SSE tails on the live bus."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from shared.engine.runtime import WAKE, Runtime
from shared.engine.testing import StubBroker
from shared.store import records
from shared.store import runs as run_store
from shared.store.tables import runs, tool_calls
from tests.engine.helpers import agent, call, submit

SPEC = agent(
    [
        {"tool_calls": [call("echo", {"text": "a"}, "c1"), call("echo", {"text": "b"}, "c2")]},
        {"text": "done"},
    ],
    tools=["echo"],
    parallel_tools=2,
)


def _events(rt: Runtime, run_id: str) -> list[Any]:
    with rt.engine.connect() as conn:
        return list(records.list_events(conn, run_id))


def test_round_and_tool_events_in_order_without_gaps(sqlite_rt: Runtime, stub: StubBroker) -> None:
    run_id = submit(sqlite_rt, SPEC)
    stub.drain(sqlite_rt)
    evs = _events(sqlite_rt, run_id)
    assert [e["seq"] for e in evs] == list(range(1, len(evs) + 1))
    assert [e["type"] for e in evs] == [
        "run.queued",
        "round.started",
        "tool.started",
        "tool.finished",
        "tool.started",
        "tool.finished",
        "round.started",
        "run.completed",
    ]  # the stub runs one message at a time
    assert [e["data"]["round"] for e in evs if e["type"] == "round.started"] == [1, 2]
    started = [e["data"] for e in evs if e["type"] == "tool.started"]
    assert {(d["call_id"], d["name"], d["round"], d["attempt"]) for d in started} == {
        ("c1", "echo", 1, 1),
        ("c2", "echo", 1, 1),
    }
    with sqlite_rt.engine.connect() as conn:
        assert run_store.get_run(conn, run_id)["event_seq"] == len(evs)  # type: ignore[index]


def test_commits_wake_the_live_bus(sqlite_rt: Runtime, stub: StubBroker) -> None:
    run_id = submit(sqlite_rt, SPEC)
    seen: list[dict[str, Any]] = []
    cancel = sqlite_rt.live.subscribe(run_id, seen.append)
    try:
        stub.drain(sqlite_rt)
    finally:
        cancel()
    wakes = [e for e in seen if e["type"] == WAKE]
    assert len(wakes) >= 5
    known = [w["seq"] for w in wakes if w["seq"] is not None]
    assert known == sorted(known) and known[-1] == len(_events(sqlite_rt, run_id))


def test_a_stale_tool_message_rolls_its_claim_back(sqlite_rt: Runtime, stub: StubBroker) -> None:
    run_id = submit(sqlite_rt, SPEC)
    stub.deliver(sqlite_rt, stub.pop())  # type: ignore[arg-type]  # the round queues c1, c2
    with sqlite_rt.engine.begin() as conn:
        conn.execute(sa.update(runs).where(runs.c.id == run_id).values(version=runs.c.version + 1))
    item = stub.pop()
    assert item is not None and item.kind == "tool"
    assert stub.deliver(sqlite_rt, item) == "stale"
    with sqlite_rt.engine.connect() as conn:
        row = (
            conn.execute(sa.select(tool_calls).where(tool_calls.c.call_id == item.call_id))
            .mappings()
            .one()
        )
    assert (row["status"], row["attempts"]) == ("queued", 0)
    assert "tool.started" not in [e["type"] for e in _events(sqlite_rt, run_id)]
