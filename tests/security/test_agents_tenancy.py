"""A tenant's agents are its own: invisible to other tenants (404), the same name free for
each; a spec saved by a tenant is policed as a submitted one."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from tests.security.conftest import MakeKey, bearer


def _spec(text: str) -> dict[str, Any]:
    return {"kind": "agent", "model": {"provider": "scripted", "replies": [{"text": text}]}}


def test_agents_are_tenant_scoped(api: TestClient, make_key: MakeKey) -> None:
    acme, globex = bearer(make_key("acme")), bearer(make_key("globex"))
    body = {"name": "support", "spec": _spec("acme's")}
    assert api.post("/v1/agents", json=body, headers=acme).status_code == 201
    assert api.get("/v1/agents/support", headers=globex).status_code == 404
    assert api.get("/v1/agents/support/versions", headers=globex).status_code == 404
    assert (
        api.put("/v1/agents/support", json={"spec": _spec("x")}, headers=globex).status_code == 404
    )
    run = api.post("/v1/runs", json={"agent": "support", "input": "hi"}, headers=globex)
    assert run.status_code == 404
    names = {a["name"] for a in api.get("/v1/agents", headers=globex).json()["agents"]}
    assert "support" not in names
    own = {"name": "support", "spec": _spec("globex's")}
    assert api.post("/v1/agents", json=own, headers=globex).json()["version"] == 1


def test_saved_specs_are_policed(api: TestClient, make_key: MakeKey) -> None:
    key = bearer(make_key("acme"))
    spec = {**_spec("x"), "mcp": [{"name": "m", "url": "http://169.254.169.254/mcp"}]}
    res = api.post("/v1/agents", json={"name": "meta", "spec": spec}, headers=key)
    assert res.status_code == 403 and "cloud metadata" in res.text
    model = {"base_url": "https://93.184.216.34/v1", "model": "m", "api_key_env": "HOME"}
    res = api.post("/v1/agents", json={"name": "k", "spec": {"model": model}}, headers=key)
    assert res.status_code == 403 and "HOME may not be named" in res.text


def test_reading_agents_needs_a_key(api: TestClient) -> None:
    assert api.get("/v1/agents/support").status_code == 401
    assert api.post("/v1/agents", json={"name": "x", "spec": _spec("x")}).status_code == 401
