"""Tenancy and API keys: every endpoint answers another tenant's run,
thread or file with 404 (as if it did not exist) and changes nothing; no key → 401; a key
without the scope → 403. Resume tokens keep working without a key."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from scheduler.app import create_app
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.store import keys
from tests.engine.helpers import agent, call
from tests.receiver import Receiver, closed_port_url
from tests.security.conftest import MakeKey, bearer, with_settings

ASK = {"question": "Which city?", "options": ["Paris", "Rome"]}
HOOK = closed_port_url()  # a tenant's webhook host must be allow-listed to be on loopback


@pytest.fixture
def secure_rt(secure_rt: Runtime) -> Runtime:
    return with_settings(secure_rt, allow_hosts=HOOK.split("/")[2])


def _ask_spec() -> dict[str, Any]:
    spec = agent([{"tool_calls": [call("ask_user", ASK, "ask1")]}, {"text": "Booked."}], ask=True)
    return spec.model_dump(mode="json", exclude_none=True)


def _approval_spec() -> dict[str, Any]:
    spec = agent(
        [{"tool_calls": [call("write_thing", {"item": "x"}, "w1")]}, {"text": "Wrote."}],
        tools=["write_thing"],
        guarded=True,
    )
    return spec.model_dump(mode="json", exclude_none=True)


@dataclass
class World:
    """Tenant A's things, and keys of tenants A and B."""

    a: str
    b: str
    ask_run: str
    approval_run: str
    approval_id: str
    thread: str
    file: str


@pytest.fixture
def world(api: TestClient, secure_rt: Runtime, stub: StubBroker, make_key: MakeKey) -> World:
    a, b = make_key("acme"), make_key("globex")
    hook = {"url": HOOK}
    ask_run = api.post(
        "/v1/runs", json={"agent": _ask_spec(), "input": "Book", "webhook": hook}, headers=bearer(a)
    ).json()["id"]
    approval_run = api.post(
        "/v1/runs", json={"agent": _approval_spec(), "input": "Write"}, headers=bearer(a)
    ).json()["id"]
    stub.drain(secure_rt)
    pending = api.get(f"/v1/runs/{approval_run}", headers=bearer(a)).json()["pending"]
    thread = api.post("/v1/threads", json={}, headers=bearer(a)).json()["id"]
    file = api.post(
        "/v1/files", files={"file": ("a.txt", b"tenant A's notes")}, headers=bearer(a)
    ).json()["id"]
    return World(a, b, ask_run, approval_run, pending["approval_id"], thread, file)


def _endpoints(w: World) -> list[tuple[str, str, dict[str, Any] | None]]:
    """Every endpoint that names one of tenant A's things: (method, path, JSON body)."""
    r = w.ask_run
    return [
        ("GET", f"/v1/runs/{r}", None),
        ("GET", f"/v1/runs/{r}/messages", None),
        ("GET", f"/v1/runs/{r}/tool-calls", None),
        ("GET", f"/v1/runs/{r}/events", None),
        ("GET", f"/v1/runs/{r}/webhook-deliveries", None),
        ("GET", f"/v1/runs/{r}/usage", None),
        ("POST", f"/v1/runs/{r}/answer", {"ask_id": "ask1", "answers": ["Paris"]}),
        (
            "POST",
            f"/v1/runs/{w.approval_run}/approval",
            {"approval_id": w.approval_id, "approve": "all"},
        ),
        ("POST", f"/v1/runs/{r}/cancel", None),
        ("GET", f"/v1/threads/{w.thread}", None),
        ("GET", f"/v1/files/{w.file}", None),
        ("POST", "/v1/runs", {"agent": "demo", "input": "hi", "thread_id": w.thread}),
    ]


def _call(api: TestClient, method: str, path: str, body: Any, headers: dict[str, str]) -> Any:
    return api.request(method, path, json=body, headers=headers)


def _state(api: TestClient, w: World) -> list[Any]:
    """What tenant A sees of its things (must not change when B tries)."""
    get = lambda p: api.get(p, headers=bearer(w.a)).json()  # noqa: E731
    return [
        get(f"/v1/runs/{w.ask_run}"),
        get(f"/v1/runs/{w.approval_run}"),
        get(f"/v1/threads/{w.thread}"),
        get(f"/v1/runs/{w.ask_run}/webhook-deliveries"),
    ]


def test_the_owner_reaches_everything(api: TestClient, world: World) -> None:
    reads = [e for e in _endpoints(world) if e[0] == "GET" and not e[1].endswith("/events")]
    for method, path, body in reads:  # (an open run's event stream does not end)
        got = _call(api, method, path, body, bearer(world.a))
        assert got.status_code == 200, (method, path, got.text)
    deliveries = api.get(
        f"/v1/runs/{world.ask_run}/webhook-deliveries", headers=bearer(world.a)
    ).json()["deliveries"]
    assert deliveries, "the waiting run has a webhook delivery"


def test_another_tenant_gets_404_everywhere_and_changes_nothing(
    api: TestClient, world: World
) -> None:
    before = _state(api, world)
    for method, path, body in _endpoints(world):
        got = _call(api, method, path, body, bearer(world.b))
        assert got.status_code == 404, (method, path, got.status_code, got.text)
        assert got.json()["error"]["code"] == "not_found"
    assert _state(api, world) == before
    assert api.get("/v1/runs", headers=bearer(world.b)).json()["runs"] == []
    listed = api.get(f"/v1/runs?thread_id={world.thread}", headers=bearer(world.b)).json()
    assert listed["runs"] == []


def test_another_tenants_file_is_unknown_as_an_attachment(api: TestClient, world: World) -> None:
    got = api.post(
        "/v1/runs",
        json={"agent": "demo", "input": "read it", "attachments": [world.file]},
        headers=bearer(world.b),
    )
    assert got.status_code == 404 and world.file in got.json()["error"]["message"]


def test_no_key_is_401_on_every_endpoint(api: TestClient, world: World) -> None:
    for method, path, body in _endpoints(world) + [
        ("GET", "/v1/runs", None),
        ("POST", "/v1/threads", {}),
        ("GET", "/v1/agents", None),
    ]:
        for headers in (
            {},
            bearer("trd_not-a-real-key-000000000000000000000000"),
            {"X-API-Key": "nope"},
            {"Authorization": "Basic dXNlcjpwYXNz"},
        ):
            got = _call(api, method, path, body, headers)
            assert got.status_code == 401, (method, path, headers, got.text)
            assert got.json()["error"]["code"] == "unauthorized"
            assert got.headers["www-authenticate"] == "Bearer"
    assert api.post("/v1/files", files={"file": ("x.txt", b"x")}).status_code == 401


def test_401_comes_before_the_body_is_read(api: TestClient) -> None:
    got = api.post("/v1/runs", content=b"{not json", headers={"content-type": "application/json"})
    assert got.status_code == 401


def test_x_api_key_header_works(api: TestClient, world: World) -> None:
    got = api.get(f"/v1/runs/{world.ask_run}", headers={"X-API-Key": world.a})
    assert got.status_code == 200


def test_missing_scope_is_403(api: TestClient, world: World, make_key: MakeKey) -> None:
    reader, writer = make_key("acme", [keys.READ]), make_key("acme", [keys.WRITE])
    writes = [e for e in _endpoints(world) if e[0] == "POST"]
    reads = [e for e in _endpoints(world) if e[0] == "GET"]
    for method, path, body in writes + [("POST", "/v1/threads", {})]:
        got = _call(api, method, path, body, bearer(reader))
        assert got.status_code == 403, (method, path, got.text)
        assert got.json()["error"] == {
            "code": "forbidden",
            "message": "this API key lacks the runs:write scope",
        }
    assert (
        api.post("/v1/files", files={"file": ("x.txt", b"x")}, headers=bearer(reader)).status_code
        == 403
    )
    for method, path, body in reads:
        got = _call(api, method, path, body, bearer(writer))
        assert got.status_code == 403, (method, path, got.text)


def test_admin_scope_holds_every_scope(api: TestClient, world: World, make_key: MakeKey) -> None:
    admin = make_key("acme", [keys.ADMIN])
    assert api.get(f"/v1/runs/{world.ask_run}", headers=bearer(admin)).status_code == 200
    assert api.post(f"/v1/runs/{world.ask_run}/cancel", headers=bearer(admin)).status_code == 200


def test_a_revoked_key_stops_at_once(api: TestClient, secure_rt: Runtime, world: World) -> None:
    assert api.get("/v1/runs", headers=bearer(world.a)).status_code == 200
    with secure_rt.engine.begin() as conn:
        [key] = [k for k in keys.list_keys(conn, "acme")]
        keys.revoke_key(conn, key.id)
    got = api.get("/v1/runs", headers=bearer(world.a))
    assert got.status_code == 401 and "revoked" in got.json()["error"]["message"]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver().start()
    yield r
    r.stop()


def test_resume_tokens_work_without_a_key(
    secure_rt: Runtime, stub: StubBroker, make_key: MakeKey, receiver: Receiver
) -> None:
    rt = Runtime(
        engine=secure_rt.engine,
        publish=stub,
        settings=secure_rt.settings.model_copy(update={"allow_hosts": "127.0.0.1"}),
    )
    key = make_key("acme")
    with TestClient(create_app(lambda: rt)) as api:
        run_id = api.post(
            "/v1/runs",
            json={"agent": _ask_spec(), "input": "Book", "webhook": {"url": receiver.url}},
            headers=bearer(key),
        ).json()["id"]
        stub.drain(rt)
        [hook] = [r.json for r in receiver.received if r.json["type"] == "run.waiting"]
        token = hook["data"]["resume"]["token"]
        body = {"ask_id": "ask1", "answers": ["Paris"]}
        wrong = api.post(
            f"/v1/runs/{run_id}/answer", json=body, headers={"X-Resume-Token": "rtk_" + "x" * 43}
        )
        assert wrong.status_code == 401
        assert api.get(f"/v1/runs/{run_id}", headers={"X-Resume-Token": token}).status_code == 401
        ok = api.post(f"/v1/runs/{run_id}/answer", json=body, headers=bearer(token))
        assert ok.status_code == 200 and ok.json()["status"] == "running"


def test_open_routes_and_metrics(secure_rt: Runtime, make_key: MakeKey) -> None:
    with TestClient(create_app(lambda: secure_rt)) as api:
        for path in ("/healthz", "/openapi.json", "/docs", "/metrics", "/"):
            assert api.get(path).status_code == 200, path  # "/": the console loads keyless
    closed = Runtime(
        engine=secure_rt.engine,
        publish=secure_rt.publish,
        settings=secure_rt.settings.model_copy(update={"metrics_public": False}),
    )
    with TestClient(create_app(lambda: closed)) as api:
        assert api.get("/metrics").status_code == 401
        assert api.get("/metrics", headers=bearer(make_key("acme"))).status_code == 403
        assert api.get("/metrics", headers=bearer(make_key("ops", [keys.ADMIN]))).status_code == 200


def test_run_counts_in_metrics_need_an_admin_key(secure_rt: Runtime, make_key: MakeKey) -> None:
    """A public scrape shows process and queue metrics, not how many runs the fleet (other
    tenants) has; an admin key sees them, also per tenant."""
    acme, admin = make_key("acme"), make_key("ops", [keys.ADMIN])
    with TestClient(create_app(lambda: secure_rt)) as api:
        made = api.post("/v1/runs", json={"agent": "demo", "input": "hi"}, headers=bearer(acme))
        assert made.status_code == 201
        for headers in ({}, bearer(acme), {"Authorization": "Bearer trd_wrong"}):
            text = api.get("/metrics", headers=headers).text
            assert "treadle_runs{" not in text and "treadle_tenant_runs" not in text
            assert "acme" not in text and "treadle_queue_depth" in text
        full = api.get("/metrics", headers=bearer(admin)).text
    assert 'treadle_tenant_runs{status="queued",tenant="acme"} 1.0' in full
    assert 'treadle_runs{status="queued"}' in full


def test_auth_off_by_default_only_for_embedded_on_loopback(sqlite_rt: Runtime) -> None:
    from scheduler.http.auth import OFF, REQUIRED, auth_mode, check_bind
    from shared.errors import ConfigError

    s = sqlite_rt.settings
    assert auth_mode(s) == OFF and auth_mode(s, "::1") == OFF
    assert auth_mode(s, "0.0.0.0") == REQUIRED
    assert auth_mode(s.model_copy(update={"broker_url": "redis://r:6379/0"})) == REQUIRED
    assert auth_mode(s.model_copy(update={"auth": "required"})) == REQUIRED
    with pytest.raises(ConfigError, match="loopback"):
        check_bind(OFF, "0.0.0.0")
    with TestClient(create_app(lambda: sqlite_rt)) as api:  # off: tenant default, all scopes
        assert api.get("/v1/runs").status_code == 200


def test_keys_cli_create_list_revoke(sqlite_rt: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    from scheduler.cli.keys import keys_app as app
    from shared import wiring
    from shared.config import reset_settings
    from shared.store.db import reset_engines

    monkeypatch.setenv("TREADLE_DATABASE_URL", sqlite_rt.settings.database_url)
    reset_settings()
    wiring.set_runtime(None)
    cli = CliRunner()
    made = cli.invoke(
        app, ["create", "--tenant", "acme", "--scope", "runs:read", "--name", "ci", "--json"]
    )
    assert made.exit_code == 0, made.output
    new = json.loads(made.output)
    assert new["key"].startswith("trd_") and new["scopes"] == ["runs:read"]
    listed = cli.invoke(app, ["list", "--json"])
    [row] = json.loads(listed.output)
    assert row["id"] == new["id"] and new["key"] not in listed.output
    assert new["key"].startswith(row["prefix"])
    assert cli.invoke(app, ["revoke", new["id"]]).exit_code == 0
    assert json.loads(cli.invoke(app, ["list", "--json"]).output)[0]["revoked_at"]
    bad = cli.invoke(app, ["create", "--tenant", "acme", "--scope", "root"])
    assert bad.exit_code == 2 and "unknown scope" in bad.output
    reserved = cli.invoke(app, ["create", "--tenant", "default"])
    assert reserved.exit_code == 2 and "reserved" in reserved.output
    wiring.set_runtime(None)
    reset_settings()
    reset_engines()


def test_only_the_hash_is_stored(secure_rt: Runtime, make_key: MakeKey) -> None:
    import sqlalchemy as sa

    from shared.store.tables import api_keys

    secret = make_key("acme")
    with secure_rt.engine.connect() as conn:
        stored = json.dumps([dict(r._mapping) for r in conn.execute(sa.select(api_keys))])
    assert secret not in stored and keys.hash_key(secret) in stored


# --- facade webhooks are signed like native ones ------------------------------------


def test_a_tenants_langgraph_webhook_is_never_sent_unsigned(
    secure_rt: Runtime, make_key: MakeKey
) -> None:
    """Without the operator's secret a tenant's webhook could only go out unsigned: it is
    refused (403) and nothing is written; with it, the run's webhook signs with the tenant's
    own secret, derived from the operator's (Standard Webhooks)."""
    import sqlalchemy as sa

    from shared.store.tables import runs
    from tests.security.conftest import row_counts

    key = make_key("acme")
    body = {"assistant_id": "demo-chat", "input": {"messages": [{"role": "user", "content": "hi"}]}}
    body["webhook"] = HOOK
    with TestClient(create_app(lambda: secure_rt)) as client:
        before = row_counts(secure_rt)
        refused = client.post("/langgraph/runs", json=body, headers=bearer(key))
        assert row_counts(secure_rt) == before
    assert refused.status_code == 403 and "TREADLE_WEBHOOK_SECRET_ENV" in refused.text
    signed = with_settings(secure_rt, webhook_secret_env="OPERATOR_HOOK_SECRET")
    with TestClient(create_app(lambda: signed)) as client:
        made = client.post("/langgraph/runs", json=body, headers=bearer(key))
        assert made.status_code == 200, made.text
    with signed.engine.connect() as conn:
        hooks = [h for h in conn.execute(sa.select(runs.c.webhook)).scalars() if h]
    assert [h["secret_env"] for h in hooks] == ["tenant:OPERATOR_HOOK_SECRET"]
