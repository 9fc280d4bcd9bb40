"""Secrets stay out of everything stored or logged.

A run uses a provider key (the fake model server checks the Authorization header it gets), an
HTTP tool header from an env var, and a signed webhook; it is submitted with an API key. Then
every text, JSON and binary column of every table, the API's views (run, messages, tool calls,
events, deliveries), the webhook bodies and every log record captured at DEBUG must hold none of
those secret values."""

from __future__ import annotations

import base64
import json
import logging
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from standardwebhooks import Webhook

from scheduler.app import create_app
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.llm.fake_server import FakeLLMServer, ReplySpec
from shared.store.tables import metadata
from tests.receiver import Receiver
from tests.security.conftest import MakeKey, bearer, with_settings
from tests.tools.conftest import LocalServer

PROVIDER_ENV, TOOL_ENV, HOOK_ENV = (
    "TREADLE_TEST_PROVIDER_KEY",
    "TREADLE_TEST_TOOL_TOKEN",
    "TREADLE_TEST_HOOK_SECRET",
)


@pytest.fixture
def llm() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as server:
        yield server


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver().start()
    yield r
    r.stop()


@pytest.fixture
def values(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The secrets, in the workers' environment only."""
    raw = secrets.token_bytes(32)
    found = {
        PROVIDER_ENV: "sk-test-" + secrets.token_hex(20),
        TOOL_ENV: "tool-" + secrets.token_hex(20),
        HOOK_ENV: "whsec_" + base64.b64encode(raw).decode(),
    }
    for name, value in found.items():
        monkeypatch.setenv(name, value)
    return found


def _needles(values: dict[str, str], api_key: str) -> list[str]:
    hook = values[HOOK_ENV]
    return [*values.values(), hook.removeprefix("whsec_"), api_key]


def _spec(llm: FakeLLMServer, tool_url: str) -> dict[str, Any]:
    tool = {
        "name": "lookup",
        "read_only": True,
        "parameters": {"type": "object"},
        "http": {"method": "GET", "url": tool_url, "headers_env": {"X-Token": TOOL_ENV}},
    }
    model = {
        "provider": "openai",
        "base_url": llm.base_url,
        "model": "fake-1",
        "api_key_env": PROVIDER_ENV,
    }
    return {"kind": "agent", "model": model, "tools": [tool], "max_rounds": 4}


def _database_text(rt: Runtime) -> str:
    """Every value of every column of every table, as text."""
    out: list[str] = []
    with rt.engine.connect() as conn:
        for table in metadata.sorted_tables:
            for row in conn.execute(sa.select(table)):
                for value in row:
                    if isinstance(value, bytes | bytearray | memoryview):
                        out.append(bytes(value).decode("latin-1"))
                    else:
                        out.append(json.dumps(value, default=str))
    return "\n".join(out)


def _api_text(api: TestClient, run_id: str, key: str) -> str:
    paths = ["", "/messages", "/tool-calls", "/webhook-deliveries", "/events", "/usage"]
    return "\n".join(api.get(f"/v1/runs/{run_id}{p}", headers=bearer(key)).text for p in paths)


def _log_text(caplog: pytest.LogCaptureFixture) -> str:
    lines = []
    for r in caplog.records:
        lines.append(r.getMessage())
        if r.exc_info:
            lines.append(logging.Formatter().formatException(r.exc_info))
        lines.append(json.dumps(r.__dict__, default=str))
    return "\n".join(lines)


def test_no_secret_is_stored_or_logged(
    secure_rt: Runtime,
    stub: StubBroker,
    make_key: MakeKey,
    llm: FakeLLMServer,
    receiver: Receiver,
    server: LocalServer,
    values: dict[str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    rt = with_settings(secure_rt, allow_hosts="127.0.0.1", spec_env_allow="TREADLE_TEST_*")
    llm.script(
        ReplySpec(
            text="Looking it up.",
            tool_calls=[{"id": "c1", "name": "lookup", "arguments": {"q": "x"}}],
        ),
        ReplySpec(text="All done."),
    )
    key = make_key("acme")
    with TestClient(create_app(lambda: rt)) as api:
        body = {
            "agent": _spec(llm, server.url("/big?n=20")),
            "input": "Find x",
            "webhook": {"url": receiver.url, "events": ["*"], "secret_env": HOOK_ENV},
        }
        made = api.post("/v1/runs", json=body, headers=bearer(key))
        assert made.status_code == 201, made.text
        run_id = made.json()["id"]
        stub.drain(rt)
        assert api.get(f"/v1/runs/{run_id}", headers=bearer(key)).json()["status"] == "completed"
        views = _api_text(api, run_id, key)

    # the secrets were used: the provider got its key, the tool its header, the hooks are signed
    assert [r.headers["authorization"] for r in llm.requests] == [
        f"Bearer {values[PROVIDER_ENV]}"
    ] * 2
    assert server.requests[0].headers["x-token"] == values[TOOL_ENV]
    assert receiver.received
    for hook in receiver.received:
        Webhook(values[HOOK_ENV]).verify(hook.body, hook.headers)

    haystacks = {
        "database": _database_text(rt),
        "api": views,
        "logs": _log_text(caplog),
        "webhook bodies": "\n".join(h.body.decode() for h in receiver.received),
    }
    assert len(haystacks["database"]) > 1000 and "All done." in haystacks["database"]
    for where, text in haystacks.items():
        for needle in _needles(values, key):
            assert needle not in text, f"a secret ({needle[:8]}…) is in the {where}"


def test_access_logs_do_not_show_api_keys() -> None:
    from scheduler.http.auth import RedactKeys

    key = "trd_" + secrets.token_urlsafe(32)
    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:50000", "GET", f"/v1/runs/run_1/events?access_token={key}&after=3", "1.1", 200),
        None,
    )
    RedactKeys().filter(record)
    line = record.getMessage()
    assert key not in line and "access_token=…&after=3" in line
    record = logging.LogRecord(
        "uvicorn.access", logging.INFO, __file__, 1, f"GET /?key={key}", None, None
    )
    RedactKeys().filter(record)
    assert key not in record.getMessage()
