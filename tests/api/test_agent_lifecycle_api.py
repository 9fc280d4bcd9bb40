"""Agent lifecycle over HTTP: tags name versions (``name@prod``), moving one is a rollback,
``latest`` pins the bare name until the next version; delete removes every version and tag
while its runs keep the spec they started with; bad input is a 4xx that writes nothing."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.store.tables import agent_tags, agent_versions


def _says(text: str) -> dict[str, Any]:
    return {"kind": "agent", "model": {"provider": "scripted", "replies": [{"text": text}]}}


def _run(client: TestClient, rt: Runtime, stub: StubBroker, agent: str) -> dict[str, Any]:
    res = client.post("/v1/runs", json={"agent": agent, "input": "hi"})
    assert res.status_code == 201, res.text
    stub.drain(rt)
    body: dict[str, Any] = client.get(f"/v1/runs/{res.json()['id']}").json()
    return body


def _three_versions(client: TestClient) -> None:
    assert client.post("/v1/agents", json={"name": "bot", "spec": _says("one")}).status_code == 201
    for text in ("two", "three"):
        assert client.put("/v1/agents/bot", json={"spec": _says(text)}).status_code == 200


def test_tags_resolve_and_a_moved_tag_is_a_rollback(
    client: TestClient, sqlite_rt: Runtime, stub: StubBroker
) -> None:
    _three_versions(client)
    prod = client.put("/v1/agents/bot/tags/prod", json={"version": 3})
    assert prod.status_code == 200 and (prod.json()["version"], prod.json()["tags"]) == (
        3,
        ["prod"],
    )
    client.put("/v1/agents/bot/tags/staging", json={"version": 3})
    assert _run(client, sqlite_rt, stub, "bot@prod")["result"]["text"] == "three"
    ran = _run(client, sqlite_rt, stub, "bot@prod")
    assert ran["agent_ref"] == "bot@3"  # the exact version it ran
    # rollback: move prod back; staging stays
    assert client.put("/v1/agents/bot/tags/prod", json={"version": 2}).json()["version"] == 2
    assert _run(client, sqlite_rt, stub, "bot@prod")["result"]["text"] == "two"
    assert client.get("/v1/agents/bot/tags").json() == {"tags": {"prod": 2, "staging": 3}}
    assert client.get("/v1/agents/bot@prod").json()["version"] == 2
    versions = client.get("/v1/agents/bot/versions").json()["versions"]
    assert [(v["version"], v["tags"]) for v in versions] == [
        (3, ["staging"]),
        (2, ["prod"]),
        (1, []),
    ]
    assert client.get(f"/v1/runs/{ran['id']}").json()["agent_ref"] == "bot@3"  # runs keep theirs
    # latest pins the bare name, until a new version is added
    client.put("/v1/agents/bot/tags/latest", json={"version": 1})
    assert _run(client, sqlite_rt, stub, "bot")["result"]["text"] == "one"
    assert client.get("/v1/agents/bot").json()["version"] == 1
    client.put("/v1/agents/bot", json={"spec": _says("four")})
    assert _run(client, sqlite_rt, stub, "bot")["result"]["text"] == "four"
    assert "latest" not in client.get("/v1/agents/bot/tags").json()["tags"]
    assert client.delete("/v1/agents/bot/tags/staging").status_code == 204
    assert client.post("/v1/runs", json={"agent": "bot@staging", "input": "hi"}).status_code == 404


def test_delete_removes_the_agent_and_its_runs_keep_their_spec(
    client: TestClient, sqlite_rt: Runtime, stub: StubBroker
) -> None:
    _three_versions(client)
    client.put("/v1/agents/bot/tags/prod", json={"version": 2})
    ran = _run(client, sqlite_rt, stub, "bot@prod")
    assert client.delete("/v1/agents/bot").status_code == 204
    assert client.get("/v1/agents/bot").status_code == 404
    assert client.get("/v1/agents/bot/versions").status_code == 404
    assert client.post("/v1/runs", json={"agent": "bot", "input": "hi"}).status_code == 404
    kept = client.get(f"/v1/runs/{ran['id']}").json()
    assert kept["agent_ref"] == "bot@2" and kept["result"]["text"] == "two"
    assert kept["agent"]["model"]["replies"] == [{"text": "two"}]
    with sqlite_rt.engine.connect() as conn:
        for table in (agent_versions, agent_tags):
            assert conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one() == 0
    assert client.delete("/v1/agents/bot").status_code == 404
    # the name can be made again
    assert client.post("/v1/agents", json={"name": "bot", "spec": _says("new")}).status_code == 201


@pytest.mark.parametrize(
    ("method", "url", "body", "status"),
    [
        ("DELETE", "/v1/agents/demo", None, 409),  # registered: read-only
        ("DELETE", "/v1/agents/bot@2", None, 422),  # the agent, not a version
        ("DELETE", "/v1/agents/nobody", None, 404),
        ("PUT", "/v1/agents/bot/tags/prod", {"version": 9}, 404),  # no such version
        ("PUT", "/v1/agents/bot/tags/Prod", {"version": 1}, 422),
        ("PUT", "/v1/agents/bot/tags/7up", {"version": 1}, 422),  # a tag starts with a letter
        ("PUT", "/v1/agents/bot/tags/prod", {"version": "1"}, 422),
        ("PUT", "/v1/agents/bot/tags/prod", {"version": 1, "x": 1}, 422),
        ("PUT", "/v1/agents/bot/tags/prod", {}, 422),
        ("PUT", "/v1/agents/demo/tags/prod", {"version": 1}, 409),
        ("PUT", "/v1/agents/nobody/tags/prod", {"version": 1}, 404),
        ("PUT", "/v1/agents/bot/tags/" + "a" * 33, {"version": 1}, 422),
        ("DELETE", "/v1/agents/bot/tags/prod", None, 404),  # not set
        ("GET", "/v1/agents/nobody/tags", None, 404),
        ("PUT", "/v1/agents/bot@prod", {"spec": _says("x")}, 409),
    ],
)
def test_bad_input_is_refused_and_writes_nothing(
    client: TestClient, sqlite_rt: Runtime, method: str, url: str, body: Any, status: int
) -> None:
    _three_versions(client)

    def rows() -> list[Any]:
        with sqlite_rt.engine.connect() as conn:
            return [
                conn.execute(sa.select(t).order_by(*t.primary_key.columns)).all()
                for t in (agent_versions, agent_tags)
            ]

    before = rows()
    got = client.request(method, url, json=body)
    assert got.status_code == status, got.text
    assert set(got.json()["error"]) >= {"code", "message"}
    assert rows() == before
