"""The console's HTTP side: static files at ``/``, ``GET /v1/agents``,
``GET /v1/runs/{id}/usage``, ``?access_token=`` on the SSE route, and the ``demo-assistant``
agent (ask → guarded write → answer) driven through the API on the stub broker."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi.testclient import TestClient

from scheduler.http.console import EventsQueryToken
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker


def test_console_files(client: TestClient) -> None:
    index = client.get("/")
    assert index.status_code == 200 and index.headers["content-type"].startswith("text/html")
    assert '<script type="module" src="/console/app.js">' in index.text
    for name, kind in (
        ("app.js", "text/javascript"),
        ("rundetail.js", "text/javascript"),
        ("style.css", "text/css"),
    ):
        r = client.get(f"/console/{name}")
        assert r.status_code == 200 and r.headers["content-type"].startswith(kind), name
    for path in ("/", "/console/app.js", "/console/style.css"):
        headers = client.get(path).headers
        csp = headers["content-security-policy"]
        assert "script-src 'self'" in csp and "default-src 'none'" in csp
        assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
        assert "frame-ancestors 'none'" in csp
        assert headers["x-content-type-options"] == "nosniff"
    assert client.get("/console/nope.js").status_code == 404
    assert client.get("/console/..%2Fapi.py").status_code == 404
    assert client.get("/console/../api.py").status_code == 404


def test_agents_lists_registered_agents(client: TestClient) -> None:
    agents = {a["name"]: a for a in client.get("/v1/agents").json()["agents"]}
    assert {"demo", "demo-chat", "demo-planner", "demo-assistant"} <= set(agents)
    assert agents["demo-assistant"] == {
        "name": "demo-assistant",
        "kind": "agent",
        "model": "demo-assistant",
        "tools": ["save_note"],
        "plan": True,
        "ask": True,
        "guarded": True,
    }
    assert agents["demo-chat"]["kind"] == "chat"


def _run(client: TestClient, run_id: str) -> dict[str, Any]:
    body: dict[str, Any] = client.get(f"/v1/runs/{run_id}").json()
    return body


def test_demo_assistant_asks_then_proposes_a_write(
    client: TestClient, sqlite_rt: Runtime, stub: StubBroker
) -> None:
    rid = client.post("/v1/runs", json={"agent": "demo-assistant", "input": "Save a note"}).json()[
        "id"
    ]
    stub.drain(sqlite_rt)
    run = _run(client, rid)
    assert run["status"] == "waiting" and run["pending"]["kind"] == "ask"
    question = run["pending"]["questions"][0]
    assert [o["value"] for o in question["options"]] == [
        "meeting-summary",
        "shopping-list",
        "reminder",
    ]
    assert [s["status"] for s in run["plan"]["steps"]] == ["pending"] * 3

    client.post(
        f"/v1/runs/{rid}/answer",
        json={"ask_id": run["pending"]["ask_id"], "answers": ["shopping-list"]},
    )
    stub.drain(sqlite_rt)
    run = _run(client, rid)
    assert run["status"] == "waiting" and run["pending"]["kind"] == "approval"
    [item] = run["pending"]["items"]
    assert item["tool"] == "save_note" and item["arguments"]["title"]

    client.post(
        f"/v1/runs/{rid}/approval",
        json={"approval_id": run["pending"]["approval_id"], "approve": "all"},
    )
    stub.drain(sqlite_rt)
    run = _run(client, rid)
    assert run["status"] == "completed", run
    assert run["result"]["text"].startswith("Done.")
    assert {s["status"] for s in run["plan"]["steps"]} == {"done"}
    calls = {c["name"]: c for c in client.get(f"/v1/runs/{rid}/tool-calls").json()["tool_calls"]}
    assert calls["save_note"]["result"].startswith("Saved note")
    assert "Shopping list - shopping-list" in calls["ask_user"]["result"]

    usage = client.get(f"/v1/runs/{rid}/usage").json()["usage"]
    assert [u["round"] for u in usage] == [1, 2, 3, 4]
    assert all(u["input_tokens"] > 0 and u["model"] == "demo-assistant" for u in usage)
    assert client.get("/v1/runs/run_missing/usage").status_code == 404


def _headers_seen(path: str, query: bytes, headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    seen: dict[str, Any] = {}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.update({k.decode(): v.decode() for k, v in scope["headers"]})

    scope = {
        "type": "http",
        "method": "GET",
        "path": path,
        "query_string": query,
        "headers": headers,
    }
    asyncio.run(EventsQueryToken(app)(scope, None, None))  # type: ignore[arg-type]
    return seen


def test_access_token_query_becomes_a_bearer_header_on_the_events_route() -> None:
    events = "/v1/runs/run_1/events"
    assert (
        _headers_seen(events, b"access_token=trd_abc&after=3", [])["authorization"]
        == "Bearer trd_abc"
    )
    assert "authorization" not in _headers_seen("/v1/runs/run_1", b"access_token=trd_abc", [])
    own = [(b"authorization", b"Bearer mine")]
    assert _headers_seen(events, b"access_token=trd_abc", own)["authorization"] == "Bearer mine"
    assert "authorization" not in _headers_seen(events, b"after=3", [])
