"""Resume, fork, messages and plan over HTTP (SQLite, stub broker, API keys required): the
shapes, 404 across tenants, 409 by state, bad bodies, and nothing written on a refusal."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from scheduler.app import create_app
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.store import keys
from shared.store.tables import metadata, runs

PLAN_AND_ASK = [
    {
        "tool_calls": [
            {"id": "p1", "name": "set_plan", "arguments": {"name": "Trip", "steps": ["a", "b"]}},
            {
                "id": "ask1",
                "name": "ask_user",
                "arguments": {"question": "Where?", "options": ["Paris", "Rome"]},
            },
        ]
    },
    {"text": "Booked."},
]
AGENT = {
    "kind": "agent",
    "plan": True,
    "ask": True,
    "model": {"provider": "scripted", "replies": PLAN_AND_ASK},
}
CHAT = {"kind": "chat", "model": {"provider": "scripted", "replies": [{"text": "Hi."}]}}


@pytest.fixture
def keyed(sqlite_rt: Runtime, stub: StubBroker) -> Iterator[tuple[TestClient, dict[str, Any]]]:
    settings = sqlite_rt.settings.model_copy(
        update={"auth": "required", "provider_wait_max_s": 3600.0}
    )
    rt = Runtime(engine=sqlite_rt.engine, settings=settings, publish=stub)
    with rt.engine.begin() as conn:
        acme = keys.create_key(conn, "acme", keys.DEFAULT_SCOPES)
        globex = keys.create_key(conn, "globex", keys.DEFAULT_SCOPES)
    with TestClient(create_app(lambda: rt)) as client:
        yield (
            client,
            {
                "acme": {"Authorization": f"Bearer {acme.secret}"},
                "globex": {"Authorization": f"Bearer {globex.secret}"},
                "acme_id": acme.key.id,
            },
        )


def _state(rt: Runtime) -> tuple[dict[str, int], list[tuple[Any, ...]]]:
    """Rows in every table, and each run's version, event seq, pending messages and status."""
    with rt.engine.connect() as conn:
        counts = {
            t.name: int(conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one())
            for t in metadata.sorted_tables
            if t.name != "workers"
        }
        rows = conn.execute(
            sa.select(
                runs.c.id, runs.c.version, runs.c.event_seq, runs.c.steer, runs.c.status
            ).order_by(runs.c.id)
        ).all()
    return counts, [tuple(r) for r in rows]


def _waiting(client: TestClient, rt: Runtime, stub: StubBroker, h: dict[str, Any]) -> str:
    run = client.post("/v1/runs", json={"agent": AGENT, "input": "Plan a trip"}, headers=h)
    assert run.status_code == 201, run.text
    stub.drain(rt)
    got = client.get(f"/v1/runs/{run.json()['id']}", headers=h).json()
    assert got["status"] == "waiting" and got["plan"] is not None
    return str(got["id"])


def test_refusals_write_nothing(
    keyed: tuple[TestClient, dict[str, Any]], sqlite_rt: Runtime, stub: StubBroker
) -> None:
    client, h = keyed
    run_id = _waiting(client, sqlite_rt, stub, h["acme"])
    done = client.post("/v1/runs", json={"agent": CHAT, "input": "hi"}, headers=h["acme"]).json()
    stub.drain(sqlite_rt)
    before = _state(sqlite_rt)
    refused: list[tuple[str, str, Any, dict[str, Any], int]] = [
        # 409: not failed or cancelled
        ("POST", f"/v1/runs/{run_id}/resume", None, h["acme"], 409),
        ("POST", f"/v1/runs/{done['id']}/resume", {}, h["acme"], 409),
        ("POST", f"/v1/runs/{done['id']}/messages", {"content": "late"}, h["acme"], 409),
        ("PATCH", f"/v1/runs/{done['id']}/plan", {"updates": []}, h["acme"], 409),
        ("POST", f"/v1/runs/{run_id}/fork", {"round": 9}, h["acme"], 409),
        (
            "POST",
            f"/v1/runs/{done['id']}/fork",
            {"round": 1, "answer": {"answers": ["x"]}},
            h["acme"],
            409,
        ),
        # 404: another tenant's run, or none
        ("POST", f"/v1/runs/{run_id}/resume", None, h["globex"], 404),
        ("POST", f"/v1/runs/{run_id}/fork", {"round": 1}, h["globex"], 404),
        ("POST", f"/v1/runs/{run_id}/messages", {"content": "hi"}, h["globex"], 404),
        (
            "PATCH",
            f"/v1/runs/{run_id}/plan",
            {"updates": [{"id": "s1", "status": "done"}]},
            h["globex"],
            404,
        ),
        ("POST", "/v1/runs/run_nope/fork", {"round": 0}, h["acme"], 404),
        # 422: bad bodies
        ("POST", f"/v1/runs/{run_id}/fork", {"round": -1}, h["acme"], 422),
        ("POST", f"/v1/runs/{run_id}/fork", {"round": 1, "extra": 1}, h["acme"], 422),
        ("POST", f"/v1/runs/{run_id}/fork", {"round": 1, "input": ""}, h["acme"], 422),
        (
            "POST",
            f"/v1/runs/{run_id}/fork",
            {"round": 1, "answer": {"answers": ["a"] * 4}},
            h["acme"],
            422,
        ),
        (
            "POST",
            f"/v1/runs/{run_id}/fork",
            {"round": 1, "agent": {"max_rounds": 0}},
            h["acme"],
            422,
        ),
        (
            "POST",
            f"/v1/runs/{run_id}/fork",
            {"round": 1, "agent": {"kind": "chat"}},
            h["acme"],
            422,
        ),
        (
            "POST",
            f"/v1/runs/{run_id}/fork",
            {"round": 1, "agent": {"tools": ["no_such"]}},
            h["acme"],
            422,
        ),
        (
            "POST",
            f"/v1/runs/{run_id}/fork",
            {"round": 1, "agent": {"provider_wait_s": 1e9}},
            h["acme"],
            422,
        ),
        ("POST", f"/v1/runs/{run_id}/messages", {"content": ""}, h["acme"], 422),
        ("POST", f"/v1/runs/{run_id}/messages", {"text": "hi"}, h["acme"], 422),
        (
            "PATCH",
            f"/v1/runs/{run_id}/plan",
            {"updates": [{"id": "s9", "status": "done"}]},
            h["acme"],
            422,
        ),
        (
            "PATCH",
            f"/v1/runs/{run_id}/plan",
            {"updates": [{"id": "s1", "status": "bad"}]},
            h["acme"],
            422,
        ),
        ("PATCH", f"/v1/runs/{run_id}/plan", {}, h["acme"], 422),
        ("POST", f"/v1/runs/{done['id']}/resume", {"agent": {"nope": 1}}, h["acme"], 422),
        # 401: no key
        ("POST", f"/v1/runs/{run_id}/fork", {"round": 1}, {}, 401),
    ]
    for method, path, body, headers, status in refused:
        r = client.request(method, path, json=body, headers=headers)
        assert r.status_code == status, (method, path, body, r.status_code, r.text)
        assert set(r.json()) == {"error"}
    assert _state(sqlite_rt) == before


def test_fork_resume_steer_and_plan_over_http(
    keyed: tuple[TestClient, dict[str, Any]], sqlite_rt: Runtime, stub: StubBroker
) -> None:
    client, h = keyed
    run_id = _waiting(client, sqlite_rt, stub, h["acme"])
    plan = client.patch(
        f"/v1/runs/{run_id}/plan",
        json={"updates": [{"id": "s1", "status": "done", "note": "by hand"}], "add_steps": ["c"]},
        headers=h["acme"],
    )
    assert plan.status_code == 200, plan.text
    steps = plan.json()["plan"]["steps"]
    assert [(s["id"], s["status"]) for s in steps] == [
        ("s1", "done"),
        ("s2", "pending"),
        ("s3", "pending"),
    ]
    said = client.post(f"/v1/runs/{run_id}/messages", json={"content": "cheap"}, headers=h["acme"])
    assert said.status_code == 200 and said.json()["status"] == "waiting"

    fork = client.post(
        f"/v1/runs/{run_id}/fork",
        json={"round": 1, "answer": {"answers": ["Rome"]}, "metadata": {"branch": "rome"}},
        headers=h["acme"],
    )
    assert fork.status_code == 201, fork.text
    forked = fork.json()
    assert forked["forked_from"] == {"run_id": run_id, "round": 1}
    assert forked["plan"] == plan.json()["plan"] and forked["metadata"] == {"branch": "rome"}
    assert client.get(f"/v1/runs/{forked['id']}", headers=h["acme"]).json()["forked_from"] == {
        "run_id": run_id,
        "round": 1,
    }
    assert client.get(f"/v1/runs/{forked['id']}", headers=h["globex"]).status_code == 404

    cancelled = client.post(f"/v1/runs/{run_id}/cancel", headers=h["acme"])
    assert cancelled.json()["status"] == "cancelled"
    resumed = client.post(f"/v1/runs/{run_id}/resume", headers=h["acme"])
    assert resumed.status_code == 200 and resumed.json()["status"] == "queued"
    stub.drain(sqlite_rt)
    for rid in (run_id, forked["id"]):
        assert client.get(f"/v1/runs/{rid}", headers=h["acme"]).json()["status"] == "completed"
    msgs = client.get(f"/v1/runs/{forked['id']}/messages", headers=h["acme"]).json()["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "tool", "assistant"]
    assert "Rome" in msgs[3]["content"] and msgs[0]["seq"] == 1 and msgs[3]["seq"] == 4
    own = client.get(f"/v1/runs/{run_id}/messages", headers=h["acme"]).json()["messages"]
    texts = [m["content"] for m in own if m["role"] in ("user", "tool")]
    assert texts[-1] == "cheap"  # the message waited through the cancel, for the resume
    events = client.get(f"/v1/runs/{run_id}/events", params={"after": 0}, headers=h["acme"])
    body = events.text
    assert "event: plan.updated" in body and "event: message.added" in body
    assert '"key_id": "' + h["acme_id"] + '"' in body and "event: run.resumed" in body


def test_submit_refuses_a_provider_wait_over_the_maximum(
    keyed: tuple[TestClient, dict[str, Any]],
) -> None:
    client, h = keyed
    agent = {**CHAT, "provider_wait_s": 7200}
    r = client.post("/v1/runs", json={"agent": agent, "input": "hi"}, headers=h["acme"])
    assert r.status_code == 422 and "TREADLE_PROVIDER_WAIT_MAX_S" in r.json()["error"]["message"]
