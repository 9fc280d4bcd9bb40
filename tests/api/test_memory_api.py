"""``/v1/memory``: items over HTTP, their limits as 4xx with the error shape (nothing written),
tenants kept apart, and a run's memory reads and writes (``GET /v1/runs/{id}/memory``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

import tests.plugins  # noqa: F401  (registers the test tools)
from scheduler.app import create_app
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.store import keys
from shared.store.tables import memory_items

ITEM = {"namespace": ["users", "u1"], "key": "colour", "value": {"text": "green"}}


def _count(rt: Runtime) -> int:
    with rt.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(memory_items)).scalar_one())


def _error(resp: Any, status: int, code: str | None = None) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    err: dict[str, Any] = resp.json()["error"]
    assert set(err) >= {"code", "message"}
    if code is not None:
        assert err["code"] == code
    return err


def test_put_get_search_delete(client: TestClient) -> None:
    put = client.put("/v1/memory/items", json={**ITEM, "ttl_s": 3600})
    assert put.status_code == 200, put.text
    body = put.json()
    assert body["namespace"] == ["users", "u1"] and body["expires_at"].endswith("Z")
    got = client.get("/v1/memory/items", params={"namespace": "users.u1", "key": "colour"})
    assert got.json()["value"] == {"text": "green"}
    client.put("/v1/memory/items", json={**ITEM, "key": "pet", "value": {"text": "a cat"}})
    found = client.post(
        "/v1/memory/search", json={"namespace_prefix": ["users"], "query": "cat"}
    ).json()
    assert [i["key"] for i in found["items"]] == ["pet"] and found["items"][0]["score"] > 0
    spaces = client.post("/v1/memory/namespaces", json={"prefix": ["users"]}).json()
    assert spaces == {"namespaces": [["users", "u1"]]}
    gone = client.delete("/v1/memory/items", params={"namespace": "users.u1", "key": "colour"})
    assert gone.status_code == 204
    missing = client.get("/v1/memory/items", params={"namespace": "users.u1", "key": "colour"})
    _error(missing, 404, "not_found")
    _error(client.delete("/v1/memory"), 422, "invalid_request")  # no prefix
    assert client.delete("/v1/memory", params={"prefix": "users"}).json() == {"deleted": 1}


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({**ITEM, "value": {"text": "x" * 70_000}}, 413, "too_large"),
        ({**ITEM, "key": "k" * 300}, 422, "invalid_request"),
        ({**ITEM, "key": "a\x01b"}, 422, "invalid_request"),
        ({**ITEM, "namespace": [str(i) for i in range(9)]}, 422, "invalid_request"),
        ({**ITEM, "namespace": ["a.b"]}, 422, "invalid_request"),
        ({**ITEM, "index": 0}, 422, "invalid_request"),
        ({**ITEM, "namespace": []}, 422, "invalid_request"),
        ({**ITEM, "value": "not an object"}, 422, "invalid_request"),
        ({**ITEM, "ttl_s": -1}, 422, "invalid_request"),
        ({**ITEM, "surprise": 1}, 422, "invalid_request"),
    ],
)
def test_bad_items_are_refused_and_nothing_is_written(
    client: TestClient, sqlite_rt: Runtime, body: dict[str, Any], status: int, code: str
) -> None:
    _error(client.put("/v1/memory/items", json=body), status, code)
    assert _count(sqlite_rt) == 0


def test_bad_searches_are_refused(client: TestClient) -> None:
    bad_op = {"filter": {"n": {"$where": "1"}}}
    _error(client.post("/v1/memory/search", json=bad_op), 422, "invalid_request")
    mixed = {"filter": {"n": {"$gt": 1, "x": 2}}}
    _error(client.post("/v1/memory/search", json=mixed), 422, "invalid_request")
    _error(client.post("/v1/memory/search", json={"refresh_ttl": 1}), 422, "invalid_request")
    _error(client.post("/v1/memory/search", json={"limit": 0}), 422, "invalid_request")
    _error(client.get("/v1/memory/items", params={"namespace": "a..b", "key": "k"}), 422)


def test_a_setting_lowers_a_limit(client: TestClient, sqlite_rt: Runtime) -> None:
    sqlite_rt.settings.memory_max_namespace_depth = 2
    sqlite_rt.settings.memory_max_key_chars = 5
    deep = {**ITEM, "namespace": ["a", "b", "c"]}
    _error(client.put("/v1/memory/items", json=deep), 422, "invalid_spec")
    _error(client.put("/v1/memory/items", json={**ITEM, "key": "longer"}), 422, "invalid_spec")
    assert _count(sqlite_rt) == 0


def test_items_per_tenant(client: TestClient, sqlite_rt: Runtime) -> None:
    sqlite_rt.settings.memory_max_items = 1
    assert client.put("/v1/memory/items", json=ITEM).status_code == 200
    _error(client.put("/v1/memory/items", json={**ITEM, "key": "k2"}), 409, "quota_exceeded")
    assert client.put("/v1/memory/items", json=ITEM).status_code == 200  # a replace is fine
    assert _count(sqlite_rt) == 1


@pytest.fixture
def keyed(sqlite_rt: Runtime) -> Iterator[tuple[TestClient, dict[str, str]]]:
    with sqlite_rt.engine.begin() as conn:
        made = {t: keys.create_key(conn, t).secret for t in ("acme", "globex")}
    with TestClient(create_app(lambda: sqlite_rt, auth="required")) as c:
        yield c, made


def test_tenants_see_only_their_own_memory(keyed: tuple[TestClient, dict[str, str]]) -> None:
    client, made = keyed
    acme = {"Authorization": f"Bearer {made['acme']}"}
    globex = {"Authorization": f"Bearer {made['globex']}"}
    assert client.put("/v1/memory/items", json=ITEM, headers=acme).status_code == 200
    params = {"namespace": "users.u1", "key": "colour"}
    _error(client.get("/v1/memory/items", params=params, headers=globex), 404)
    assert client.post("/v1/memory/search", json={}, headers=globex).json() == {"items": []}
    _error(client.delete("/v1/memory/items", params=params, headers=globex), 404)
    assert client.get("/v1/memory/items", params=params, headers=acme).status_code == 200
    _error(client.get("/v1/memory/items", params=params), 401, "unauthorized")


def test_a_runs_memory_reads_and_writes(
    client: TestClient, sqlite_rt: Runtime, stub: StubBroker
) -> None:
    spec = {
        "kind": "agent",
        "tools": ["remember"],
        "model": {
            "provider": "scripted",
            "replies": [
                {
                    "tool_calls": [
                        {"id": "c1", "name": "remember", "arguments": {"fact": "likes tea"}}
                    ]
                },
                {"text": "ok"},
            ],
        },
    }
    body = {"agent": spec, "input": "hi", "metadata": {"user_id": "u7"}}
    run = client.post("/v1/runs", json=body).json()
    stub.drain(sqlite_rt)
    events = client.get(f"/v1/runs/{run['id']}/memory").json()["events"]
    assert [e["type"] for e in events] == ["memory.written"]
    assert events[0]["data"]["namespace"] == ["memories", "u7"]
    item = client.post("/v1/memory/search", json={"namespace_prefix": ["memories"]}).json()
    assert item["items"][0]["run_id"] == run["id"]
    refused = client.post("/v1/runs", json={**body, "metadata": {}})
    assert "metadata.user_id" in _error(refused, 422, "invalid_spec")["message"]
