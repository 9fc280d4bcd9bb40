"""Read-only tools run in the round's own task, opted in (``worker_read_tools_in_round``):
a tool round is one task and one commit; the transcript, the events and the tool's timeout are
those of a tool task. Off (the default), every external call is its own ``treadle.tool``
task. Against a real local HTTP server."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.store import calls as call_store
from shared.store import records
from tests.engine.helpers import agent, call, run, submit, transcript

from .conftest import LocalServer


def _rt(sqlite_rt: Runtime, in_round: bool, **more: Any) -> Runtime:
    update = {"allow_hosts": "127.0.0.1", "worker_read_tools_in_round": in_round, **more}
    return replace(sqlite_rt, settings=sqlite_rt.settings.model_copy(update=update))


def _lookup(server: LocalServer, path: str = "/item", read_only: bool = True) -> dict[str, Any]:
    return {
        "name": "lookup",
        "description": "Look an item up.",
        "read_only": read_only,
        "parameters": {"type": "object", "properties": {"id": {"type": "string"}}},
        "http": {"method": "GET", "url": server.url(path) + "?id={id}"},
    }


def _two_lookups(server: LocalServer, **spec: Any) -> Any:
    replies: list[dict[str, Any]] = [
        {"tool_calls": [call("lookup", {"id": "a"}, "c1")]},
        {"tool_calls": [call("lookup", {"id": "b"}, "c2")]},
        {"text": "found both"},
    ]
    return agent(replies, tools=[_lookup(server, **spec)])


def _kinds(stub: StubBroker, run_id: str) -> list[str]:
    return [d.kind for d in stub.sent if d.run_id == run_id]


def _tool_events(rt: Runtime, run_id: str) -> list[tuple[str, str]]:
    with rt.engine.connect() as conn:
        events = records.list_events(conn, run_id)
    return [(e["type"], e["data"]["call_id"]) for e in events if e["type"].startswith("tool.")]


@pytest.mark.parametrize("in_round", [True, False])
def test_a_read_runs_in_the_round_only_when_opted_in(
    any_rt: Runtime, stub: StubBroker, server: LocalServer, in_round: bool
) -> None:
    rt = _rt(any_rt, in_round)
    run_id = submit(rt, _two_lookups(server))
    stub.drain(rt)
    assert run(rt, run_id)["status"] == "completed"
    kinds = _kinds(stub, run_id)
    assert kinds.count("round") == 3
    assert kinds.count("tool") == (0 if in_round else 2)
    assert [r.query["id"] for r in server.requests] == [["a"], ["b"]]  # each read ran once
    roles = [role for role, _, _ in transcript(rt, run_id)]
    assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    tools = [text for role, text, _ in transcript(rt, run_id) if role == "tool"]
    assert all('"path": "/item"' in t for t in tools)
    with rt.engine.connect() as conn:  # the HTTP status is kept either way
        data = [c.data for c in call_store.list_tool_calls(conn, run_id)]
    assert data == [{"status": 200}, {"status": 200}]
    assert _tool_events(rt, run_id) == [
        ("tool.started", "c1"),
        ("tool.finished", "c1"),
        ("tool.started", "c2"),
        ("tool.finished", "c2"),
    ]


def test_a_write_is_its_own_task_even_when_opted_in(
    sqlite_rt: Runtime, stub: StubBroker, server: LocalServer
) -> None:
    rt = _rt(sqlite_rt, True)
    run_id = submit(rt, _two_lookups(server, read_only=False))
    stub.drain(rt)
    assert run(rt, run_id)["status"] == "completed"
    assert _kinds(stub, run_id).count("tool") == 2


def test_a_batch_of_reads_fans_out_side_by_side(
    sqlite_rt: Runtime, stub: StubBroker, server: LocalServer
) -> None:
    # the round would run a batch's reads one after another: a batch of two is two tasks
    rt = _rt(sqlite_rt, True)
    reply = {"tool_calls": [call("lookup", {"id": "a"}, "c1"), call("lookup", {"id": "b"}, "c2")]}
    spec = agent([reply, {"text": "both"}], tools=[_lookup(server)], parallel_tools=2)
    run_id = submit(rt, spec)
    stub.drain(rt)
    assert run(rt, run_id)["status"] == "completed"
    assert _kinds(stub, run_id).count("tool") == 2


def test_a_read_in_the_round_keeps_the_tools_timeout(
    sqlite_rt: Runtime, stub: StubBroker, server: LocalServer
) -> None:
    # the slow endpoint trickles for ~20 s; the operator's tool timeout ends it
    rt = _rt(sqlite_rt, True, tool_timeout=0.5)
    spec = agent(
        [{"tool_calls": [call("lookup", {"id": "a"}, "c1")]}, {"text": "gave up"}],
        tools=[_lookup(server, "/slow")],
    )
    run_id = submit(rt, spec)
    stub.drain(rt)
    assert run(rt, run_id)["status"] == "completed"
    assert _kinds(stub, run_id).count("tool") == 0
    tools = [text for role, text, _ in transcript(rt, run_id) if role == "tool"]
    assert tools == ["Tool error: timed out after 0.5s"]
