"""Limits: body size (also chunked), input length, tools per spec, runs in flight per
tenant, submissions per minute per key — 413 or 429 with Retry-After, and nothing written. With
auth required, a tenant's spec may name only allowed env vars and public model hosts."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from scheduler.app import create_app
from shared.agent.spec import ModelProfile
from shared.config import Settings
from shared.engine.runtime import Runtime
from shared.store import runs as run_store
from tests.security.conftest import MakeKey, bearer, row_counts, with_settings

CHAT = {"kind": "chat", "model": "demo"}


@pytest.fixture
def limited(secure_rt: Runtime) -> Runtime:
    return with_settings(
        secure_rt, max_input_chars=1000, max_tools=3, max_runs_in_flight=2, submits_per_minute=4
    )


@pytest.fixture
def client(limited: Runtime) -> Iterator[TestClient]:
    with TestClient(create_app(lambda: limited)) as c:
        yield c


def _submit(client: TestClient, key: str, **body: Any) -> Any:
    return client.post("/v1/runs", json={"agent": CHAT, "input": "hi", **body}, headers=bearer(key))


def test_body_over_2mb_is_413_with_or_without_content_length(
    client: TestClient, limited: Runtime, make_key: MakeKey
) -> None:
    key, before = make_key("acme"), row_counts(limited)
    big = b'{"agent": "demo", "input": "' + b"x" * 2_100_000 + b'"}'
    got = client.post(
        "/v1/runs", content=big, headers={**bearer(key), "content-type": "application/json"}
    )
    assert got.status_code == 413 and got.json()["error"]["code"] == "too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        yield big[:1_000_000]
        yield big[1_000_000:]

    got = client.post(
        "/v1/runs", content=chunks(), headers={**bearer(key), "content-type": "application/json"}
    )
    assert got.status_code == 413 and "2 MB" in got.json()["error"]["message"]
    assert row_counts(limited) == before


def test_input_length_and_tool_count(
    client: TestClient, limited: Runtime, make_key: MakeKey
) -> None:
    key, before = make_key("acme"), row_counts(limited)
    long_input = _submit(client, key, input="x" * 1001)
    assert long_input.status_code == 413
    assert "TREADLE_MAX_INPUT_CHARS" in long_input.json()["error"]["message"]
    as_messages = _submit(client, key, input=[{"role": "user", "content": "y" * 1001}])
    assert as_messages.status_code == 413
    tools = {
        "kind": "agent",
        "model": "demo",
        "tools": ["calculator", "current_time", "http_get", "stop"],
    }
    too_many = client.post("/v1/runs", json={"agent": tools, "input": "hi"}, headers=bearer(key))
    assert too_many.status_code == 413 and "TREADLE_MAX_TOOLS" in too_many.text
    assert row_counts(limited) == before


def test_runs_in_flight_per_tenant(client: TestClient, limited: Runtime, make_key: MakeKey) -> None:
    a, b = make_key("acme"), make_key("globex")
    first = _submit(client, a).json()["id"]
    assert _submit(client, a).status_code == 201
    before = row_counts(limited)
    third = _submit(client, a)
    assert third.status_code == 429 and third.json()["error"]["code"] == "too_many_runs"
    assert int(third.headers["retry-after"]) >= 1
    assert row_counts(limited) == before
    assert _submit(client, b).status_code == 201  # another tenant has its own count
    client.post(f"/v1/runs/{first}/cancel", headers=bearer(a))
    assert _submit(client, a).status_code == 201


def test_an_idempotent_replay_is_not_a_new_run(client: TestClient, make_key: MakeKey) -> None:
    a = make_key("acme")
    headers = {**bearer(a), "Idempotency-Key": "k1"}
    made = client.post("/v1/runs", json={"agent": CHAT, "input": "hi"}, headers=headers)
    _submit(client, a)
    again = client.post("/v1/runs", json={"agent": CHAT, "input": "hi"}, headers=headers)
    assert (made.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == made.json()["id"]


def test_submissions_per_minute_per_key(secure_rt: Runtime, make_key: MakeKey) -> None:
    rt = with_settings(secure_rt, submits_per_minute=3)
    a, a2 = make_key("acme"), make_key("acme")
    with TestClient(create_app(lambda: rt)) as client:
        for _ in range(3):
            assert _submit(client, a).status_code == 201
        before = row_counts(rt)
        over = _submit(client, a)
        assert over.status_code == 429 and over.json()["error"]["code"] == "rate_limited"
        assert 1 <= int(over.headers["retry-after"]) <= 60
        assert row_counts(rt) == before
        assert _submit(client, a2).status_code == 201  # per key


def _profile(**kw: Any) -> dict[str, Any]:
    return {
        "kind": "chat",
        "model": {"provider": "openai", "base_url": "https://93.184.216.34/v1", "model": "m", **kw},
    }


def test_a_tenant_spec_names_only_allowed_env_vars(
    secure_rt: Runtime, make_key: MakeKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = make_key("acme")
    with TestClient(create_app(lambda: secure_rt)) as client:
        before = row_counts(secure_rt)
        for agent, hook in [
            (_profile(api_key_env="TREADLE_DATABASE_URL"), None),
            (
                {
                    "kind": "agent",
                    "model": "demo",
                    "tools": [
                        {
                            "name": "t",
                            "http": {
                                "url": "https://93.184.216.34/x",
                                "headers_env": {"X-Key": "AWS_SECRET"},
                            },
                        }
                    ],
                },
                None,
            ),
            (CHAT, {"url": "https://93.184.216.34/hook", "secret_env": "HOME"}),
        ]:
            got = client.post(
                "/v1/runs",
                json={"agent": agent, "input": "hi", "webhook": hook},
                headers=bearer(key),
            )
            assert got.status_code == 403 and "TREADLE_SPEC_ENV_ALLOW" in got.text, got.text
        private = client.post(
            "/v1/runs",
            json={
                "agent": {
                    "kind": "chat",
                    "model": {
                        "provider": "openai",
                        "base_url": "http://169.254.169.254/",
                        "model": "m",
                    },
                },
                "input": "hi",
            },
            headers=bearer(key),
        )
        assert private.status_code == 403 and "cloud metadata" in private.text
        assert row_counts(secure_rt) == before
    allowed = with_settings(secure_rt, spec_env_allow="ACME_*,HOOK_SECRET")
    with TestClient(create_app(lambda: allowed)) as client:
        ok = client.post(
            "/v1/runs",
            json={
                "agent": _profile(api_key_env="ACME_OPENAI_KEY"),
                "input": "hi",
                "webhook": {"url": "https://93.184.216.34/h", "secret_env": "HOOK_SECRET"},
            },
            headers=bearer(key),
        )
        assert ok.status_code == 201, ok.text


def test_test_models_are_refused_unless_the_operator_allows_them(
    secure_rt: Runtime, make_key: MakeKey
) -> None:
    scripted = {"provider": "scripted", "replies": [{"sleep": 40, "text": "held"}]}
    nested = {
        "kind": "agent",
        "model": "demo",
        "tools": [{"name": "helper", "agent": {"kind": "chat", "model": scripted}}],
    }
    key = make_key("acme")
    closed = with_settings(secure_rt, allow_test_models=False)
    with TestClient(create_app(lambda: closed)) as client:
        before = row_counts(closed)
        for agent in ({"kind": "chat", "model": scripted}, nested):
            got = client.post("/v1/runs", json={"agent": agent, "input": "hi"}, headers=bearer(key))
            assert got.status_code == 422 and "TREADLE_ALLOW_TEST_MODELS" in got.text, got.text
        assert row_counts(closed) == before
        registered = client.post(  # the operator's own agent may use it
            "/v1/runs", json={"agent": "demo-assistant", "input": "hi"}, headers=bearer(key)
        )
        assert registered.status_code == 201, registered.text
    assert Settings(broker_url="memory://", allow_test_models=None).test_models_allowed
    assert not Settings(broker_url="redis://r:6379/0", allow_test_models=None).test_models_allowed
    assert Settings(broker_url="redis://r:6379/0", allow_test_models=True).test_models_allowed


def test_timeouts_retries_and_budgets_are_bounded(secure_rt: Runtime, make_key: MakeKey) -> None:
    """Out of range (negative, non-finite) → 422 from the spec; above the operator's maximum
    → 422 naming the setting; nothing written either way."""
    key = make_key("acme")
    rt = with_settings(secure_rt, spec_max_deadline_s=60, spec_max_model_timeout_s=30)
    public = {"provider": "openai", "base_url": "https://93.184.216.34/v1", "model": "m"}
    hostile: list[tuple[dict[str, Any], str]] = [
        ({"kind": "chat", "budget": {"deadline_s": 3600}}, "TREADLE_SPEC_MAX_DEADLINE_S"),
        ({"kind": "chat", "budget": {"deadline_s": -1}}, "greater than 0"),
        ({"kind": "chat", "budget": {"max_cost": -5}}, "greater than or equal to 0"),
        ({"kind": "chat", "model": {**public, "timeout_read": 9999}}, "MODEL_TIMEOUT_S"),
        ({"kind": "chat", "model": {**public, "max_retries": 1000}}, "MODEL_RETRIES"),
        ({"kind": "chat", "model": {**public, "max_retries": -1}}, "greater than or equal"),
        ({"kind": "chat", "ask_timeout_s": 10**9}, "ASK_TIMEOUT_S"),
        (
            {"kind": "chat", "model": {**public, "pricing": {"tiers": [{"input": -1}]}}},
            "greater than or equal to 0",
        ),
        (
            {
                "kind": "agent",
                "model": "demo",
                "tools": [
                    {"name": "t", "http": {"url": "https://93.184.216.34/", "timeout_s": 1e6}}
                ],
            },
            "TOOL_TIMEOUT_S",
        ),
        (
            {
                "kind": "agent",
                "model": "demo",
                "tools": [
                    {"name": "helper", "agent": {"kind": "chat", "budget": {"deadline_s": 999}}}
                ],
            },
            "TREADLE_SPEC_MAX_DEADLINE_S",
        ),
    ]
    with TestClient(create_app(lambda: rt)) as client:
        before = row_counts(rt)
        for agent, why in hostile:
            got = client.post("/v1/runs", json={"agent": agent, "input": "x"}, headers=bearer(key))
            assert got.status_code == 422 and why in got.text, (agent, got.text)
        nan = client.post(
            "/v1/runs",
            content=b'{"agent": {"kind": "chat", "budget": {"max_cost": NaN}}, "input": "x"}',
            headers={**bearer(key), "content-type": "application/json"},
        )
        assert nan.status_code == 422, nan.text
        assert row_counts(rt) == before
        ok = {"kind": "chat", "budget": {"deadline_s": 60}, "model": {**public, "timeout_read": 30}}
        got = client.post("/v1/runs", json={"agent": ok, "input": "x"}, headers=bearer(key))
        assert got.status_code == 201, got.text
    with rt.engine.connect() as conn:
        stored = run_store.get_run(conn, got.json()["id"], "acme")
    assert stored is not None
    model = stored["agent"]["model"]  # defaults over a maximum are lowered to it
    assert (model["timeout_read"], model["timeout_total"], model["timeout_connect"]) == (30, 30, 10)


def test_an_inline_profile_cannot_take_an_operator_profile_name(
    secure_rt: Runtime, make_key: MakeKey
) -> None:
    operator = ModelProfile(name="shared-gpt", base_url="https://93.184.216.34/v1").as_operator()
    rt = Runtime(
        engine=secure_rt.engine,
        settings=secure_rt.settings,
        publish=secure_rt.publish,
        profiles={"shared-gpt": operator},
    )
    key = make_key("acme")
    with TestClient(create_app(lambda: rt)) as client:
        before = row_counts(rt)
        for name in ("shared-gpt", "demo"):
            model = {"name": name, "base_url": "https://93.184.216.34/v1", "model": "m"}
            got = client.post(
                "/v1/runs",
                json={"agent": {"kind": "chat", "model": model}, "input": "x"},
                headers=bearer(key),
            )
            assert got.status_code == 422 and "operator's model profile" in got.text, got.text
        assert row_counts(rt) == before
        by_name = client.post(  # naming it is how a tenant uses it
            "/v1/runs",
            json={"agent": {"kind": "chat", "model": "shared-gpt"}, "input": "x"},
            headers=bearer(key),
        )
        assert by_name.status_code == 201, by_name.text


def test_a_blocked_webhook_url_is_refused_at_submit(secure_rt: Runtime, make_key: MakeKey) -> None:
    key = make_key("acme")
    with TestClient(create_app(lambda: secure_rt)) as client:
        before = row_counts(secure_rt)
        for url in ("http://127.0.0.1:9/h", "http://169.254.169.254/", "http://10.0.0.7/hook"):
            got = client.post(
                "/v1/runs",
                json={"agent": CHAT, "input": "x", "webhook": {"url": url}},
                headers=bearer(key),
            )
            assert got.status_code == 403 and "webhook.url" in got.text, got.text
        assert row_counts(secure_rt) == before
