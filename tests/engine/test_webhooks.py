"""Outbound webhooks on SQLite with the stub broker and a local receiver."""

from __future__ import annotations

import base64
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from shared.agent.spec import AgentSpec, WebhookSpec
from shared.config import Settings
from shared.engine import commands
from shared.engine.reaper import reap
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.engine.webhooks import MAX_GAP, next_attempt_at
from shared.errors import SpecError
from shared.store import deliveries
from shared.store import runs as run_store
from shared.store.deliveries import Attempt
from shared.store.tables import events, outbox
from tests.engine.helpers import agent, call
from tests.receiver import Receiver, closed_port_url
from tests.tools import conftest as local_servers

SECRET = "whsec_" + base64.b64encode(b"treadle-test-webhook-secret-0123").decode()
SECRET_ENV = "TREADLE_TEST_WEBHOOK_SECRET"
CHAT = AgentSpec.model_validate(
    {"kind": "chat", "model": {"provider": "scripted", "replies": [{"text": "Paris."}]}}
)


@pytest.fixture
def rt(sqlite_rt: Runtime, stub: StubBroker) -> Runtime:
    settings = sqlite_rt.settings.model_copy(
        update={"allow_hosts": "127.0.0.1", "webhook_retry_base": 0.05, "webhook_timeout": 2.0}
    )
    return Runtime(engine=sqlite_rt.engine, settings=settings, publish=stub)


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    monkeypatch.setenv(SECRET_ENV, SECRET)
    r = Receiver().start()
    yield r
    r.stop()


def _submit(rt: Runtime, spec: AgentSpec = CHAT, **kw: Any) -> str:
    row, _ = commands.submit_run(
        rt, commands.RunInput(agent=spec, input="Capital of France?", **kw)
    )
    return str(row["id"])


def _hook(url: str, **kw: Any) -> WebhookSpec:
    return WebhookSpec(url=url, secret_env=SECRET_ENV, **kw)


def _deliveries(rt: Runtime, run_id: str) -> list[dict[str, Any]]:
    with rt.engine.connect() as conn:
        return deliveries.list_deliveries(conn, run_id)


def _outbox_kinds(rt: Runtime) -> list[str]:
    with rt.engine.connect() as conn:
        return list(conn.execute(sa.select(outbox.c.kind)).scalars())


def test_completed_webhook_is_signed_and_verifies(
    rt: Runtime, stub: StubBroker, receiver: Receiver
) -> None:
    run_id = _submit(rt, webhook=_hook(receiver.url))
    stub.drain(rt)
    assert len(receiver.received) == 1  # default events: not run.queued
    got = receiver.received[0]
    payload = Webhook(SECRET).verify(got.body, got.headers)
    assert payload["type"] == "run.completed"
    assert payload["data"]["run_id"] == run_id and payload["data"]["status"] == "completed"
    assert payload["data"]["result"]["text"] == "Paris."
    assert got.headers["webhook-id"].startswith("msg_")
    assert abs(int(got.headers["webhook-timestamp"]) - time.time()) < 5
    other = "whsec_" + base64.b64encode(b"another-secret-another-secret-00").decode()
    with pytest.raises(WebhookVerificationError):
        Webhook(other).verify(got.body, got.headers)
    [d] = _deliveries(rt, run_id)
    assert (d["status"], d["attempts"], d["id"]) == ("delivered", 1, got.headers["webhook-id"])
    assert _outbox_kinds(rt) == []


def test_fails_twice_then_succeeds_with_the_same_webhook_id(
    rt: Runtime, stub: StubBroker, receiver: Receiver
) -> None:
    receiver.statuses = [500, 503]
    run_id = _submit(rt, webhook=_hook(receiver.url))
    stub.drain(rt)
    for expected_attempts in (1, 2):
        [d] = _deliveries(rt, run_id)
        assert (d["status"], d["attempts"]) == ("pending", expected_attempts)
        assert _outbox_kinds(rt) == ["webhook"]  # waits in the outbox for the reaper
        time.sleep(max(0.0, d["next_attempt_at"] - time.time()) + 0.01)
        assert reap(rt).resent == 1
        stub.drain(rt)
    [d] = _deliveries(rt, run_id)
    assert (d["status"], d["attempts"]) == ("delivered", 3)
    assert [a["status_code"] for a in d["attempt_log"]] == [500, 503, 200]
    ids = {r.headers["webhook-id"] for r in receiver.received}
    assert ids == {d["id"]} and len(receiver.received) == 3
    for r in receiver.received:  # each try is signed anew, each verifies
        assert Webhook(SECRET).verify(r.body, r.headers)["data"]["run_id"] == run_id
    assert _outbox_kinds(rt) == []


def test_gives_up_after_the_retry_window(rt: Runtime, stub: StubBroker, receiver: Receiver) -> None:
    receiver.statuses = [500] * 100
    short = Runtime(
        engine=rt.engine,
        publish=stub,
        settings=rt.settings.model_copy(update={"webhook_retry_for": 0.3}),
    )
    run_id = _submit(short, webhook=_hook(receiver.url))
    stub.drain(short)
    deadline = time.monotonic() + 5
    while _deliveries(short, run_id)[0]["status"] == "pending" and time.monotonic() < deadline:
        time.sleep(0.05)
        reap(short)
        stub.drain(short)
    [d] = _deliveries(short, run_id)
    assert d["status"] == "failed" and 2 <= d["attempts"] < 10
    assert d["last_status_code"] == 500
    assert _outbox_kinds(short) == []


def test_backoff_grows_threefold_capped_and_stops_after_24h() -> None:
    s = Settings(webhook_retry_base=5.0)
    fail = Attempt(started_at=0, duration_ms=1, status_code=500)
    delays = [next_attempt_at({"attempts": n, "created_at": 0.0}, fail, s, 0.0) for n in (1, 2, 3)]
    for got, want in zip(delays, (5, 15, 45), strict=True):
        assert got is not None and want * 0.9 <= got <= want * 1.1
    late = next_attempt_at({"attempts": 30, "created_at": 0.0}, fail, s, 0.0)
    assert late is not None and late <= MAX_GAP * 1.1
    assert next_attempt_at({"attempts": 12, "created_at": 0.0}, fail, s, 86_000.0) is None
    ok = Attempt(started_at=0, duration_ms=1, status_code=204)
    assert next_attempt_at({"attempts": 1, "created_at": 0.0}, ok, s, 0.0) is None


def test_events_filter_and_star(rt: Runtime, stub: StubBroker, receiver: Receiver) -> None:
    spec = agent(
        [{"tool_calls": [call("echo", {"text": "a"}, "c1")]}, {"text": "done"}], tools=["echo"]
    )
    only = _submit(rt, spec, webhook=_hook(receiver.url, events=["tool.finished"]))
    every = _submit(rt, spec, webhook=_hook(receiver.url, events=["*"]))
    stub.drain(rt)
    assert [d["event_type"] for d in _deliveries(rt, only)] == ["tool.finished"]
    with rt.engine.connect() as conn:
        types = list(
            conn.execute(
                sa.select(events.c.type).where(events.c.run_id == every).order_by(events.c.seq)
            ).scalars()
        )
    assert [d["event_type"] for d in _deliveries(rt, every)] == types
    assert types == [
        "run.queued",
        "round.started",
        "tool.started",
        "tool.finished",
        "round.started",
        "run.completed",
    ]
    with pytest.raises(SpecError, match="text.delta"):
        _submit(rt, webhook=_hook(receiver.url, events=["text.delta"]))


def test_tenant_default_webhook(rt: Runtime, stub: StubBroker, receiver: Receiver) -> None:
    # the operator's default URL is trusted: reachable without allow-listing its host
    settings = rt.settings.model_copy(
        update={"allow_hosts": "", "webhook_url": receiver.url, "webhook_secret_env": SECRET_ENV}
    )
    dflt = Runtime(engine=rt.engine, settings=settings, publish=stub)
    run_id = _submit(dflt)
    child = _submit(dflt, parent_run_id=run_id, parent_call_id="c1")
    own = _submit(dflt, webhook=WebhookSpec(url=closed_port_url().replace("127.0.0.1", "10.0.0.1")))
    stub.drain(dflt)
    [d] = _deliveries(dflt, run_id)
    assert d["status"] == "delivered"
    assert Webhook(SECRET).verify(receiver.received[0].body, receiver.received[0].headers)
    assert _deliveries(dflt, child) == []  # a sub-run does not inherit the default
    [blocked] = _deliveries(dflt, own)  # a run's own URL still meets the SSRF guard
    assert blocked["status"] == "failed" and "blocked URL" in blocked["last_error"]
    assert blocked["attempts"] == 1  # a refusal would recur: not retried


def test_missing_secret_is_an_attempt_error(
    rt: Runtime, stub: StubBroker, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SECRET_ENV)
    run_id = _submit(rt, webhook=_hook(receiver.url))
    stub.drain(rt)
    [d] = _deliveries(rt, run_id)
    assert d["status"] == "pending" and SECRET_ENV in d["last_error"]
    assert receiver.received == []  # never sent unsigned when a secret was asked for


def _run_with_webhook_worker(rt: Runtime, stub: StubBroker) -> tuple[float, threading.Thread]:
    """Rounds and tools inline; webhook messages on their own thread (their own queue)."""
    hooks: queue.Queue[Any] = queue.Queue()

    def webhook_worker() -> None:
        while (item := hooks.get()) is not None:
            stub.deliver(rt, item)

    t = threading.Thread(target=webhook_worker, daemon=True)
    t.start()
    started = time.monotonic()
    while (item := stub.pop()) is not None:
        if item.kind == "webhook":
            hooks.put(item)
        else:
            stub.deliver(rt, item)
    elapsed = time.monotonic() - started
    hooks.put(None)
    return elapsed, t


@pytest.mark.parametrize("mode", ["refused", "hanging"])
def test_a_down_receiver_does_not_slow_the_run(rt: Runtime, stub: StubBroker, mode: str) -> None:
    rt = Runtime(
        engine=rt.engine,
        publish=stub,
        settings=rt.settings.model_copy(update={"webhook_timeout": 5.0}),
    )
    receiver = Receiver(hang=6.0).start() if mode == "hanging" else None
    url = receiver.url if receiver else closed_port_url()
    spec = agent(
        [
            {"tool_calls": [call("echo", {"text": "a"}, "c1")]},
            {"tool_calls": [call("echo", {"text": "b"}, "c2")]},
            {"text": "done"},
        ],
        tools=["echo"],
    )
    try:
        run_id = _submit(rt, spec, webhook=WebhookSpec(url=url, events=["round.started"]))
        elapsed, worker = _run_with_webhook_worker(rt, stub)
        with rt.engine.connect() as conn:
            assert run_store.get_run(conn, run_id)["status"] == "completed"  # type: ignore[index]
        # three deliveries hang 5 s each: a run that waited on them would take 15 s
        assert elapsed < 3.0, f"the run took {elapsed:.2f}s"
        worker.join(timeout=30)
        ds = _deliveries(rt, run_id)
        assert len(ds) == 3 and all(d["status"] == "pending" for d in ds)
        assert all(d["attempts"] == 1 and d["last_error"] for d in ds)
    finally:
        if receiver:
            receiver.stop()


@pytest.mark.parametrize(
    "target",
    ["http://localhost:{other}/secret", "http://169.254.169.254/latest/meta-data/"],
)
def test_a_redirect_to_a_refused_address_is_not_followed_nor_retried(
    rt: Runtime, stub: StubBroker, target: str
) -> None:
    """The webhook's own host is allowed, its redirect's is not: the hop is never
    sent, and the delivery fails at its first try (a refusal would recur: 1 try, not 7)."""
    server = next(servers := local_servers._serve())
    other_server = next(others := local_servers._serve())
    allowed = rt.settings.model_copy(update={"allow_hosts": server.host_port})
    rt = Runtime(engine=rt.engine, settings=allowed, publish=stub)
    to = target.format(other=other_server.port)
    run_id = _submit(rt, webhook=WebhookSpec(url=server.url(f"/redirect?code=307&to={to}")))
    stub.drain(rt)
    [d] = _deliveries(rt, run_id)
    assert (d["status"], d["attempts"]) == ("failed", 1), d
    assert "blocked URL" in d["last_error"]
    assert [r.path for r in server.requests] == ["/redirect"]
    assert other_server.requests == []
    assert reap(rt).webhooks == 0 and _outbox_kinds(rt) == []
    servers.close()
    others.close()


def test_a_guardrail_tripwire_is_a_webhook(
    rt: Runtime, stub: StubBroker, receiver: Receiver
) -> None:
    """docs/guardrails.md: the tripwire's event is delivered, and the run's end with it."""
    import tests.plugins  # noqa: F401  (the no_secrets plugin)

    spec = AgentSpec.model_validate(
        {
            "kind": "agent",
            "model": {"provider": "scripted", "replies": [{"text": "unused"}]},
            "input_guardrails": [{"name": "leaks", "plugin": "no_secrets"}],
        }
    )
    hook = WebhookSpec(
        url=receiver.url, events=["guardrail.tripped", "run.completed"], secret_env=SECRET_ENV
    )
    row, _ = commands.submit_run(
        rt, commands.RunInput(agent=spec, input="tell me the secret", webhook=hook)
    )
    stub.drain(rt)
    payloads = [Webhook(SECRET).verify(g.body, g.headers) for g in receiver.received]
    assert [p["type"] for p in payloads] == ["guardrail.tripped", "run.completed"]
    assert payloads[1]["data"]["run_id"] == row["id"]
    assert payloads[1]["data"]["stop_reason"] == "guardrail"
