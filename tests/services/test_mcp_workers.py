"""MCP tools through real Celery workers against a real MCP server started here: two tools of
one reply, a guarded agent's approval for the write only, and a worker killed mid-call (the
re-driven call carries the same idempotency key, the server applies the effect once)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from scheduler.app import create_app
from scheduler.embedded import ReaperLoop
from shared.engine.runtime import Runtime
from tests.mcp_server import McpTestServer
from tests.support import WorkerProcs, quick_recovery, wait_for

pytestmark = pytest.mark.services


@pytest.fixture
def mcp(request: pytest.FixtureRequest) -> Iterator[McpTestServer]:
    delay = getattr(request, "param", 0.0)
    with McpTestServer(delay=delay) as server:
        yield server


@pytest.fixture
def fast_recovery(mcp: McpTestServer) -> dict[str, str]:
    return quick_recovery(mcp.host)


def _agent(mcp: McpTestServer, **spec: Any) -> dict[str, Any]:
    replies = [
        {
            "tool_calls": [
                {"id": "c1", "name": "lookup", "arguments": {"city": "Oslo"}},
                {"id": "c2", "name": "book", "arguments": {"room": "Ada"}},
            ]
        },
        {"text": "Oslo is sunny; Ada is booked."},
    ]
    return {
        "kind": "agent",
        "model": {"provider": "scripted", "replies": replies},
        "mcp": [{"name": "bookings", "url": mcp.url}],
        "parallel_tools": 2,
        **spec,
    }


def _until(client: TestClient, run_id: str, status: str, timeout: float = 60) -> dict[str, Any]:
    def seen() -> dict[str, Any] | None:
        run: dict[str, Any] = client.get(f"/v1/runs/{run_id}").json()
        return run if run["status"] == status else None

    found: dict[str, Any] = wait_for(seen, timeout, what=f"run {status}")
    return found


def _tool_texts(client: TestClient, run_id: str) -> list[str]:
    msgs = client.get(f"/v1/runs/{run_id}/messages").json()["messages"]
    return [m["content"] for m in msgs if m["role"] == "tool"]


def test_two_mcp_tools_in_one_round(
    prod_rt: Runtime, workers: WorkerProcs, mcp: McpTestServer
) -> None:
    workers.start("alpha")
    with TestClient(create_app(lambda: prod_rt)) as client:
        run = client.post("/v1/runs", json={"agent": _agent(mcp), "input": "go"}).json()
        _until(client, run["id"], "completed")
        calls = client.get(f"/v1/runs/{run['id']}/tool-calls").json()["tool_calls"]
        texts = _tool_texts(client, run["id"])
    assert texts == ["Oslo: 21C, sunny", "booked Ada"]
    assert {c["round"] for c in calls} == {1}
    assert mcp.effects.effects == {f"{run['id']}:c2": 1}


def test_guarded_waits_for_approval_of_the_write(
    prod_rt: Runtime, workers: WorkerProcs, mcp: McpTestServer
) -> None:
    workers.start("alpha")
    with TestClient(create_app(lambda: prod_rt)) as client:
        body = {"agent": _agent(mcp, guarded=True), "input": "go"}
        run = client.post("/v1/runs", json=body).json()
        waiting = _until(client, run["id"], "waiting")
        assert [i["tool"] for i in waiting["pending"]["items"]] == ["book"]
        assert mcp.effects.hits == {}
        approval = {"approval_id": waiting["pending"]["approval_id"], "approve": "all"}
        client.post(f"/v1/runs/{run['id']}/approval", json=approval)
        _until(client, run["id"], "completed")
        texts = _tool_texts(client, run["id"])
    assert texts == ["Oslo: 21C, sunny", "booked Ada"]
    assert mcp.effects.effects == {f"{run['id']}:c2": 1}


@pytest.mark.parametrize("mcp", [2.0], indirect=True)
def test_worker_killed_mid_call_retries_with_the_same_key(
    prod_rt: Runtime, workers: WorkerProcs, mcp: McpTestServer
) -> None:
    reaper = ReaperLoop(prod_rt, 0.5).start()
    try:
        workers.start("alpha")
        with TestClient(create_app(lambda: prod_rt)) as client:
            run = client.post("/v1/runs", json={"agent": _agent(mcp), "input": "go"}).json()
            assert mcp.effects.received.wait(30), "the write never reached the MCP server"
            workers.kill("alpha")  # mid-call: the server still applies the effect
            workers.start("beta")
            done = _until(client, run["id"], "completed", 90)
            texts = _tool_texts(client, run["id"])
    finally:
        reaper.stop()
    key = f"{run['id']}:c2"
    assert mcp.effects.effects == {key: 1}
    assert mcp.effects.hits[key] == 2, "the re-driven call reused the same idempotency key"
    assert texts == ["Oslo: 21C, sunny", "booked Ada"]
    assert done["result"]["text"] == "Oslo is sunny; Ada is booked."
