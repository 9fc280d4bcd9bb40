"""Agents over the API: create, immutable versions, read, list; runs name the latest or an
exact version and keep the version they ran; registered agents are read-only; a spec is
checked as a run's is, before anything is written."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker


def _says(text: str, **spec: Any) -> dict[str, Any]:
    return {
        "kind": "agent",
        "model": {"provider": "scripted", "replies": [{"text": text}]},
        **spec,
    }


def _create(client: TestClient, name: str, text: str, **extra: Any) -> dict[str, Any]:
    res = client.post("/v1/agents", json={"name": name, "spec": _says(text), **extra})
    assert res.status_code == 201, res.text
    body: dict[str, Any] = res.json()
    return body


def _run(client: TestClient, rt: Runtime, stub: StubBroker, agent: str) -> dict[str, Any]:
    res = client.post("/v1/runs", json={"agent": agent, "input": "hi"})
    assert res.status_code == 201, res.text
    stub.drain(rt)
    body: dict[str, Any] = client.get(f"/v1/runs/{res.json()['id']}").json()
    return body


def test_versions_and_runs_keep_theirs(
    client: TestClient, sqlite_rt: Runtime, stub: StubBroker
) -> None:
    first = _create(client, "support", "one", description="Answers", metadata={"team": "a"})
    assert (first["version"], first["ref"], first["source"]) == (1, "support@1", "api")
    assert first["description"] == "Answers" and first["metadata"] == {"team": "a"}
    second = client.put("/v1/agents/support", json={"spec": _says("two")}).json()
    assert (second["version"], second["ref"]) == (2, "support@2")

    assert client.get("/v1/agents/support").json()["version"] == 2
    assert client.get("/v1/agents/support@1").json()["spec"]["model"]["replies"] == [
        {"text": "one"}
    ]
    versions = client.get("/v1/agents/support/versions").json()["versions"]
    assert [v["version"] for v in versions] == [2, 1]

    latest = _run(client, sqlite_rt, stub, "support")
    assert (latest["result"]["text"], latest["agent_ref"]) == ("two", "support@2")
    old = _run(client, sqlite_rt, stub, "support@1")
    assert (old["result"]["text"], old["agent_ref"]) == ("one", "support@1")
    client.put("/v1/agents/support", json={"spec": _says("three")})
    again = client.get(f"/v1/runs/{latest['id']}").json()
    assert again["agent_ref"] == "support@2"  # the run keeps the version it ran
    assert again["agent"]["model"]["replies"] == [{"text": "two"}]

    listed = {a["name"]: a for a in client.get("/v1/agents").json()["agents"]}
    assert listed["support"]["version"] == 3 and "demo" in listed
    assert _run(client, sqlite_rt, stub, "demo")["agent_ref"] == "demo"


def test_registered_agents_are_read_only(client: TestClient) -> None:
    res = client.post("/v1/agents", json={"name": "demo", "spec": _says("x")})
    assert res.status_code == 409 and "read-only" in res.text
    res = client.put("/v1/agents/demo", json={"spec": _says("x")})
    assert res.status_code == 409
    view = client.get("/v1/agents/demo").json()
    assert (view["source"], view["read_only"], view["version"]) == ("registered", True, None)
    assert client.get("/v1/agents/demo@1").status_code == 404
    assert client.get("/v1/agents/demo/versions").json()["versions"][0]["ref"] == "demo"


def test_names_conflicts_and_unknowns(client: TestClient) -> None:
    _create(client, "dup", "x")
    assert client.post("/v1/agents", json={"name": "dup", "spec": _says("y")}).status_code == 409
    assert client.put("/v1/agents/nope", json={"spec": _says("y")}).status_code == 404
    assert client.put("/v1/agents/dup@1", json={"spec": _says("y")}).status_code == 409
    assert client.get("/v1/agents/nope").status_code == 404
    assert client.get("/v1/agents/dup@7").status_code == 404
    assert client.get("/v1/agents/nope/versions").status_code == 404
    bad = client.post("/v1/agents", json={"name": "has space", "spec": _says("y")})
    assert bad.status_code == 422
    res = client.post("/v1/runs", json={"agent": "dup@9", "input": "hi"})
    assert res.status_code == 404


def test_spec_checked_like_a_runs(client: TestClient, sqlite_rt: Runtime) -> None:
    cases = [
        ({"tools": ["no_such_tool"]}, 422, "unknown tool"),
        ({"mcp": [{"name": "m", "command": ["sh"]}]}, 403, "stdio servers"),
        ({"tools": [{"name": "t", "agent": "ghost"}]}, 404, "no agent named 'ghost'"),
        ({"tools": [{"name": "k", "knowledge": {"datasets": ["nope"]}}]}, 404, "nope"),
    ]
    for extra, status, message in cases:
        res = client.post("/v1/agents", json={"name": "bad", "spec": _says("x", **extra)})
        assert res.status_code == status, (extra, res.text)
        assert message in res.text, res.text
    assert client.get("/v1/agents/bad").status_code == 404  # nothing was written


def test_tool_agents_may_name_the_tenants_agents(
    client: TestClient, sqlite_rt: Runtime, stub: StubBroker
) -> None:
    _create(client, "helper", "helped")
    outer = {
        "kind": "agent",
        "model": {
            "provider": "scripted",
            "replies": [
                {"tool_calls": [{"id": "c1", "name": "ask_helper", "arguments": {"input": "?"}}]},
                {"text": "done"},
            ],
        },
        "tools": [{"name": "ask_helper", "description": "Ask.", "agent": "helper@1"}],
    }
    res = client.post("/v1/agents", json={"name": "outer", "spec": outer})
    assert res.status_code == 201, res.text
    run = _run(client, sqlite_rt, stub, "outer")
    assert run["status"] == "completed"
    tool = run["agent"]["tools"][0]
    assert tool["agent"]["model"]["replies"] == [{"text": "helped"}]  # resolved into the run
