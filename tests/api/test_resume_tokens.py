"""Resume tokens: a per-pause credential in the run.waiting webhook answers its own
ask (or approval) and nothing else — wrong run, wrong ask, wrong action, expired → 401;
reused, or the pause is over → 409. It never appears in the API's run views or events."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from scheduler.app import create_app
from shared.engine import webhooks
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.store.deliveries import REDACTED_TOKEN, hash_token
from shared.store.tables import events, resume_tokens, webhook_deliveries
from tests.engine.helpers import agent, call
from tests.receiver import Receiver

ASK = {"question": "Which city?", "options": ["Paris", "Rome"]}


def _ask_agent(**kw: Any) -> dict[str, Any]:
    spec = agent(
        [{"tool_calls": [call("ask_user", ASK, "ask1")]}, {"text": "Booked."}], ask=True, **kw
    )
    return spec.model_dump(mode="json", exclude_none=True)


def _approval_agent() -> dict[str, Any]:
    spec = agent(
        [{"tool_calls": [call("write_thing", {"item": "x"}, "w1")]}, {"text": "Wrote."}],
        tools=["write_thing"],
        guarded=True,
    )
    return spec.model_dump(mode="json", exclude_none=True)


@pytest.fixture
def rt(sqlite_rt: Runtime, stub: StubBroker) -> Runtime:
    settings = sqlite_rt.settings.model_copy(update={"allow_hosts": "127.0.0.1"})
    return Runtime(engine=sqlite_rt.engine, settings=settings, publish=stub)


@pytest.fixture
def api(rt: Runtime) -> Iterator[TestClient]:
    with TestClient(create_app(lambda: rt)) as c:
        yield c


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver().start()
    yield r
    r.stop()


def _waiting(
    api: TestClient, rt: Runtime, stub: StubBroker, receiver: Receiver, spec: dict[str, Any]
) -> tuple[str, dict[str, Any]]:
    """Submit, run to the pause; (run id, the ``resume`` block of its run.waiting webhook)."""
    run_id = api.post(
        "/v1/runs", json={"agent": spec, "input": "Book a trip", "webhook": {"url": receiver.url}}
    ).json()["id"]
    stub.drain(rt)
    assert api.get(f"/v1/runs/{run_id}").json()["status"] == "waiting"
    hooks = [r.json for r in receiver.received if r.json["data"]["run_id"] == run_id]
    [waiting] = [h for h in hooks if h["type"] == "run.waiting"]
    return run_id, waiting["data"]["resume"]


def _answer(
    api: TestClient, run_id: str, token: str, ask_id: str = "ask1", header: str = "bearer"
) -> Any:
    headers = (
        {"Authorization": f"Bearer {token}"} if header == "bearer" else {"X-Resume-Token": token}
    )
    return api.post(
        f"/v1/runs/{run_id}/answer", json={"ask_id": ask_id, "answers": ["Paris"]}, headers=headers
    )


def test_a_token_answers_its_own_ask_and_nothing_else(
    api: TestClient, rt: Runtime, stub: StubBroker, receiver: Receiver
) -> None:
    a, ra = _waiting(api, rt, stub, receiver, _ask_agent())
    b, rb = _waiting(api, rt, stub, receiver, _ask_agent())
    assert ra["kind"] == "ask" and ra["pause_id"] == "ask1" and ra["path"] == f"/v1/runs/{a}/answer"
    assert ra["token"].startswith("rtk_") and ra["token"] != rb["token"]

    assert _answer(api, b, ra["token"]).status_code == 401  # another run's token
    assert _answer(api, a, ra["token"], ask_id="ask2").status_code == 401  # another ask
    wrong_action = api.post(
        f"/v1/runs/{a}/approval",
        json={"approval_id": "ask1", "approve": "all"},
        headers={"X-Resume-Token": ra["token"]},
    )
    assert wrong_action.status_code == 401
    bogus = _answer(api, a, "rtk_" + "x" * 43)
    assert bogus.status_code == 401 and bogus.json()["error"]["code"] == "unauthorized"
    assert bogus.headers["www-authenticate"] == "Bearer"
    assert api.get(f"/v1/runs/{a}").json()["status"] == "waiting"  # nothing happened

    ok = _answer(api, a, ra["token"])
    assert ok.status_code == 200 and ok.json()["status"] == "running"
    again = _answer(api, a, ra["token"])
    assert again.status_code == 409 and "already used" in again.json()["error"]["message"]
    stub.drain(rt)
    assert api.get(f"/v1/runs/{a}").json()["status"] == "completed"
    assert _answer(api, a, ra["token"]).status_code == 409  # still spent after the run ended

    assert _answer(api, b, rb["token"], header="x-resume-token").status_code == 200


def test_a_token_expires_with_its_pause(
    api: TestClient, rt: Runtime, stub: StubBroker, receiver: Receiver
) -> None:
    run_id, resume = _waiting(api, rt, stub, receiver, _ask_agent())
    assert api.post(f"/v1/runs/{run_id}/cancel").status_code == 200
    late = _answer(api, run_id, resume["token"])
    assert late.status_code == 409 and "no longer waiting" in late.json()["error"]["message"]

    run_id, resume = _waiting(api, rt, stub, receiver, _ask_agent(ask_timeout_s=0.2))
    assert resume["expires_at"] is not None
    time.sleep(0.3)  # past the ask's expiry, before the reaper acts on it
    assert _answer(api, run_id, resume["token"]).status_code == 401


def test_an_approval_token_decides_that_approval(
    api: TestClient, rt: Runtime, stub: StubBroker, receiver: Receiver
) -> None:
    run_id, resume = _waiting(api, rt, stub, receiver, _approval_agent())
    assert resume["kind"] == "approval" and resume["path"].endswith("/approval")
    approval_id = resume["pause_id"]
    assert approval_id == api.get(f"/v1/runs/{run_id}").json()["pending"]["approval_id"]
    assert _answer(api, run_id, resume["token"], ask_id=approval_id).status_code == 401
    r = api.post(
        f"/v1/runs/{run_id}/approval",
        json={"approval_id": approval_id, "approve": "all"},
        headers={"Authorization": f"Bearer {resume['token']}"},
    )
    assert r.status_code == 200 and r.json()["status"] == "running"
    stub.drain(rt)
    assert api.get(f"/v1/runs/{run_id}").json()["status"] == "completed"


def test_the_token_is_only_in_the_webhook(
    api: TestClient, rt: Runtime, stub: StubBroker, receiver: Receiver
) -> None:
    run_id, resume = _waiting(api, rt, stub, receiver, _ask_agent())
    token = resume["token"]
    assert token not in api.get(f"/v1/runs/{run_id}").text
    assert token not in api.get("/v1/runs").text
    log = api.get(f"/v1/runs/{run_id}/webhook-deliveries")
    assert log.status_code == 200 and token not in log.text
    [d] = [d for d in log.json()["deliveries"] if d["event_type"] == "run.waiting"]
    assert d["payload"]["data"]["resume"]["token"] == "rtk_…"
    assert d["status"] == "delivered" and d["attempt_log"][0]["status_code"] == 200
    with rt.engine.connect() as conn:
        datas = conn.execute(sa.select(events.c.data).where(events.c.run_id == run_id)).scalars()
        assert all(token not in json.dumps(x) for x in datas)
        stored = conn.execute(sa.select(resume_tokens.c.token_hash)).scalars().all()
        assert token not in stored and stored == [hash_token(token)]
        bodies = conn.execute(sa.select(webhook_deliveries.c.body)).scalars().all()
    assert all(token not in b for b in bodies)  # each try mints its own (below)


def test_keyless_answers_still_work_and_other_bearers_are_not_tokens(
    api: TestClient, rt: Runtime, stub: StubBroker, receiver: Receiver
) -> None:
    run_id, _ = _waiting(api, rt, stub, receiver, _ask_agent())
    r = api.post(
        f"/v1/runs/{run_id}/answer",
        json={"ask_id": "ask1", "answers": ["Rome"]},
        headers={"Authorization": "Bearer sk-some-api-key"},
    )
    assert r.status_code == 200  # an API key is the security layer's business, not a token


def test_each_try_carries_a_fresh_token_and_none_is_stored(
    api: TestClient, rt: Runtime, stub: StubBroker
) -> None:
    failing = Receiver(statuses=[500]).start()
    try:
        run_id = api.post(
            "/v1/runs",
            json={"agent": _ask_agent(), "input": "Book", "webhook": {"url": failing.url}},
        ).json()["id"]
        stub.drain(rt)  # the run.waiting delivery's first try gets a 500
        d = webhook_deliveries.c
        with rt.engine.begin() as conn:
            delivery_id = conn.execute(
                sa.select(d.id).where(d.run_id == run_id, d.event_type == "run.waiting")
            ).scalar_one()
            conn.execute(
                sa.update(webhook_deliveries).where(d.id == delivery_id).values(next_attempt_at=0)
            )
        assert webhooks.deliver(rt, delivery_id, None) == "delivered"
    finally:
        failing.stop()
    tries = [r for r in failing.received if r.json["type"] == "run.waiting"]
    tokens = [t.json["data"]["resume"]["token"] for t in tries]
    assert len(tokens) == 2 and tokens[0] != tokens[1]
    assert all(t.startswith("rtk_") and t != REDACTED_TOKEN for t in tokens)
    assert tries[0].headers["webhook-id"] == tries[1].headers["webhook-id"]
    with rt.engine.connect() as conn:
        stored = " ".join(
            str(v) for row in conn.execute(sa.select(webhook_deliveries)) for v in row
        )
        hashes = set(conn.execute(sa.select(resume_tokens.c.token_hash)).scalars())
    assert not any(t in stored for t in tokens) and REDACTED_TOKEN in stored
    assert {hash_token(t) for t in tokens} <= hashes
    assert _answer(api, run_id, tokens[1]).status_code == 200
    assert _answer(api, run_id, tokens[0]).status_code == 409  # the pause is over
