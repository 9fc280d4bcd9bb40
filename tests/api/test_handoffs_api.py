"""Handoff targets named by agent name are resolved at submit (docs/handoffs.md): a saved
agent's spec goes into the run's; an unknown name is a 404, an endless chain a 422; nothing
is written for either."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

BILLING = {"kind": "agent", "model": "demo", "guarded": True, "tools": ["calculator"]}


def _triage(target: Any) -> dict[str, Any]:
    return {"kind": "agent", "model": "demo", "handoffs": [{"name": "billing", "agent": target}]}


def test_a_named_target_is_resolved_into_the_run(client: TestClient) -> None:
    assert client.post("/v1/agents", json={"name": "billing", "spec": BILLING}).status_code == 201
    r = client.post("/v1/runs", json={"agent": _triage("billing"), "input": "hi"})
    assert r.status_code in (200, 201, 202), r.text


def test_an_unknown_target_is_a_404_and_writes_nothing(client: TestClient) -> None:
    r = client.post("/v1/runs", json={"agent": _triage("nobody"), "input": "hi"})
    assert r.status_code == 404 and "handoff 'billing'" in r.text
    assert client.get("/v1/runs").json()["runs"] == []


def test_an_endless_chain_is_a_422_and_writes_nothing(client: TestClient) -> None:
    def to(name: str) -> dict[str, Any]:
        return {"kind": "agent", "model": "demo", "handoffs": [{"name": name, "agent": name}]}

    plain = {"kind": "agent", "model": "demo"}
    assert client.post("/v1/agents", json={"name": "ping", "spec": plain}).status_code == 201
    assert client.post("/v1/agents", json={"name": "pong", "spec": to("ping")}).status_code == 201
    assert client.put("/v1/agents/ping", json={"spec": to("pong")}).status_code == 200
    r = client.post("/v1/runs", json={"agent": "pong", "input": "hi"})
    assert r.status_code == 422 and "handoffs chain at most" in r.text
    assert client.get("/v1/runs").json()["runs"] == []


def test_a_target_that_is_not_a_tool_agent_is_a_422(client: TestClient) -> None:
    r = client.post("/v1/runs", json={"agent": _triage({"kind": "chat"}), "input": "hi"})
    assert r.status_code == 422, r.text
    assert client.get("/v1/runs").json()["runs"] == []
