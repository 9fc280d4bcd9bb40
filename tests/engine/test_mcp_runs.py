"""MCP tools inside runs (stub broker, SQLite): two tools of one reply, a guarded agent's
approval for the write only, an unreachable server as a tool result; what the API refuses."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from scheduler.app import create_app
from shared.agent.spec import AgentSpec
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from tests.engine.helpers import agent, call, run, submit, transcript
from tests.mcp_server import McpTestServer


@pytest.fixture
def mcp() -> Iterator[McpTestServer]:
    with McpTestServer() as server:
        yield server


@pytest.fixture
def rt(sqlite_rt: Runtime, mcp: McpTestServer) -> Runtime:
    settings = sqlite_rt.settings.model_copy(update={"allow_hosts": mcp.host})
    return Runtime(engine=sqlite_rt.engine, settings=settings, publish=sqlite_rt.publish)


TWO_CALLS = [
    {
        "tool_calls": [
            call("lookup", {"city": "Oslo"}, "c1"),
            call("book", {"room": "Ada"}, "c2"),
        ]
    },
    {"text": "Oslo is sunny; Ada is booked."},
]


def _tools(rt: Runtime, run_id: str) -> list[str]:
    return [text for role, text, _ in transcript(rt, run_id) if role == "tool"]


def test_two_mcp_tools_in_one_round(rt: Runtime, stub: StubBroker, mcp: McpTestServer) -> None:
    spec = agent(TWO_CALLS, mcp=[{"name": "bookings", "url": mcp.url}], parallel_tools=2)
    run_id = submit(rt, spec)
    stub.drain(rt)
    assert run(rt, run_id)["status"] == "completed"
    assert _tools(rt, run_id) == ["Oslo: 21C, sunny", "booked Ada"]
    assert mcp.effects.effects == {f"{run_id}:c2": 1}


def test_guarded_waits_for_the_write_only(
    rt: Runtime, stub: StubBroker, mcp: McpTestServer
) -> None:
    from shared.engine import commands

    spec = agent(TWO_CALLS, mcp=[{"name": "bookings", "url": mcp.url}], guarded=True)
    run_id = submit(rt, spec)
    stub.drain(rt)
    waiting = run(rt, run_id)
    assert waiting["status"] == "waiting"
    assert [i["tool"] for i in waiting["pending"]["items"]] == ["book"]
    assert mcp.effects.hits == {}  # nothing written before the approval
    commands.approve_run(rt, "default", run_id, waiting["pending"]["approval_id"], "all")
    stub.drain(rt)
    assert run(rt, run_id)["status"] == "completed"
    assert _tools(rt, run_id) == ["Oslo: 21C, sunny", "booked Ada"]


def test_read_only_by_spec_needs_no_approval(
    rt: Runtime, stub: StubBroker, mcp: McpTestServer
) -> None:
    replies = [{"tool_calls": [call("tally", {"item": "cups"}, "c1")]}, {"text": "ok"}]
    server = {"name": "bookings", "url": mcp.url, "read_only": ["tally"]}
    run_id = submit(rt, agent(replies, mcp=[server], guarded=True))
    stub.drain(rt)
    assert run(rt, run_id)["status"] == "completed"
    assert _tools(rt, run_id) == ["counted cups"]


def test_server_down_at_call_time_is_a_tool_result(rt: Runtime, stub: StubBroker) -> None:
    with McpTestServer() as server:
        local = rt.settings.model_copy(update={"allow_hosts": server.host})
        rt = Runtime(engine=rt.engine, settings=local, publish=rt.publish)
        replies = [{"tool_calls": [call("lookup", {"city": "Oslo"}, "c1")]}, {"text": "Sorry."}]
        run_id = submit(rt, agent(replies, mcp=[{"name": "bookings", "url": server.url}]))
        first = stub.pop()  # round 1: the tools are listed, the call is queued
        assert first is not None
        stub.deliver(rt, first)
    stub.drain(rt)
    done = run(rt, run_id)
    assert (done["status"], done["result"]["text"]) == ("completed", "Sorry.")
    assert _tools(rt, run_id)[0].startswith("Tool error: MCP server 'bookings': unreachable")


def test_server_never_listed_leaves_its_tools_out(sqlite_rt: Runtime, stub: StubBroker) -> None:
    replies = [{"text": "No tools today."}]
    spec = agent(replies, mcp=[{"name": "gone", "url": "http://127.0.0.1:9/mcp"}])
    run_id = submit(sqlite_rt, spec)  # submitting contacts no server
    stub.drain(sqlite_rt)
    assert run(sqlite_rt, run_id)["status"] == "completed"


def _agent_body(**mcp: Any) -> dict[str, Any]:
    return {"kind": "agent", "model": "demo", "mcp": [{"name": "srv", **mcp}]}


def test_api_refuses_stdio_servers(sqlite_rt: Runtime) -> None:
    body = _agent_body(command=["python", "-m", "evil"])
    with TestClient(create_app(lambda: sqlite_rt)) as client:
        res = client.post("/v1/runs", json={"agent": body, "input": "hi"})
    assert res.status_code == 403
    assert "stdio servers (`command`) are for agents the operator registers" in res.text


def test_an_unreachable_server_is_a_warning_event_a_log_line_a_metric_and_a_note(
    sqlite_rt: Runtime, stub: StubBroker, caplog: pytest.LogCaptureFixture
) -> None:
    """The tools of a server that cannot be listed do not vanish silently: the
    round records ``tool.unavailable`` (a warning), logs it, counts it, and the model's
    system text says which server's tools are missing."""
    from shared.engine import metrics
    from shared.llm.fake_server import FakeLLMServer
    from shared.store import records
    from shared.vocab import EventType

    before = metrics.MCP_UNAVAILABLE._value.get()
    with FakeLLMServer() as llm:
        llm.script({"text": "I cannot book now."})
        model = {"provider": "openai", "base_url": llm.base_url, "model": "fake-1"}
        spec = AgentSpec.model_validate(
            {
                "kind": "agent",
                "model": model,
                "system_prompt": "Book rooms.",
                "mcp": [{"name": "gone", "url": "http://127.0.0.1:9/mcp"}],
            }
        )
        settings = sqlite_rt.settings.model_copy(update={"allow_hosts": "127.0.0.1"})
        rt = Runtime(engine=sqlite_rt.engine, settings=settings, publish=sqlite_rt.publish)
        with caplog.at_level("WARNING", logger="treadle.mcp"):
            run_id = submit(rt, spec)
            stub.drain(rt)
        system = llm.bodies[0]["messages"][0]
    assert run(rt, run_id)["status"] == "completed"
    assert system["role"] == "system" and system["content"].startswith("Book rooms.")
    assert "the tools of the MCP server(s) gone are unavailable" in system["content"]
    with rt.engine.connect() as conn:
        [event] = records.list_events_of(conn, run_id, [EventType.TOOL_UNAVAILABLE])
    data = event["data"]
    assert data["level"] == "warning" and data["round"] == 1
    assert data["servers"][0]["server"] == "gone"
    assert "unreachable" in data["servers"][0]["reason"]
    assert metrics.MCP_UNAVAILABLE._value.get() >= before + 1
    assert any("MCP server 'gone' are unavailable" in r.getMessage() for r in caplog.records)
