"""A tenant's agents are its own: invisible to other tenants (404), the same name free for
each; a spec saved by a tenant is policed as a submitted one."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from scheduler.app import create_app
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from tests.security.conftest import MakeKey, bearer, with_settings


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


def test_a_saved_agent_meets_the_policy_in_force_when_it_runs(
    secure_rt: Runtime, stub: StubBroker, make_key: MakeKey
) -> None:
    """Saved under a policy that allowed it, refused once the operator narrows it: run by
    name, named by another spec's tool agent, or fired by a cron made before the change (the
    cron is paused, nothing runs)."""
    from shared.engine import schedule
    from shared.store import schedules as cron_store

    model = {"base_url": "https://93.184.216.34/v1", "model": "m", "api_key_env": "OK_KEY"}
    saved = {"kind": "agent", "model": model}
    key = bearer(make_key("acme"))
    before = with_settings(secure_rt, spec_env_allow="OK_*")
    with TestClient(create_app(lambda: before)) as client:
        made = client.post("/v1/agents", json={"name": "keyed", "spec": saved}, headers=key)
        assert made.status_code == 201, made.text
        cron = {"agent": "keyed", "input": "tick", "schedule": "* * * * *"}
        cron_id = client.post("/v1/crons", json=cron, headers=key).json()["id"]
    after = with_settings(secure_rt, spec_env_allow="")
    wrapper = {
        "kind": "agent",
        "model": "demo",
        "tools": [{"name": "helper", "description": "asks keyed", "agent": "keyed"}],
    }
    with TestClient(create_app(lambda: after)) as client:
        by_name = client.post("/v1/runs", json={"agent": "keyed", "input": "hi"}, headers=key)
        as_tool = client.post("/v1/runs", json={"agent": wrapper, "input": "hi"}, headers=key)
        registered = {**wrapper, "tools": [{"name": "h", "description": "d", "agent": "demo"}]}
        fine = client.post("/v1/runs", json={"agent": registered, "input": "hi"}, headers=key)
    assert by_name.status_code == 403 and "OK_KEY may not be named" in by_name.text
    assert as_tool.status_code == 403 and "OK_KEY may not be named" in as_tool.text
    assert fine.status_code == 201, fine.text  # an operator's agent is not policed
    with after.engine.connect() as conn:
        stored = cron_store.get_cron(conn, cron_id)
    assert stored is not None and stored.next_fire is not None
    assert schedule.fire_crons(after, stored.next_fire + 1) == 0
    with after.engine.connect() as conn:
        paused = cron_store.get_cron(conn, cron_id)
    assert paused is not None and paused.next_fire is None and paused.last_run_id is None
