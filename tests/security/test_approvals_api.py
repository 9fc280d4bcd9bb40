"""Approvals over the API with a key: per-item decisions, and who decided (the key's id) on
each call and in the ``run.resumed`` event."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.store import calls as call_store
from shared.store import keys, records
from tests.security.conftest import bearer

GUARDED: dict[str, Any] = {
    "kind": "agent",
    "guarded": True,
    "parallel_tools": 2,
    "tools": ["write_thing"],
    "model": {
        "provider": "scripted",
        "replies": [
            {
                "tool_calls": [
                    {"id": "w1", "name": "write_thing", "arguments": {"item": "A"}},
                    {"id": "w2", "name": "write_thing", "arguments": {"item": "B"}},
                ]
            },
            {"text": "done"},
        ],
    },
}


def test_decisions_over_the_api_record_the_approvers_key(
    api: TestClient, secure_rt: Runtime, stub: StubBroker
) -> None:
    with secure_rt.engine.begin() as conn:
        made = keys.create_key(conn, "acme", keys.DEFAULT_SCOPES)
    auth = bearer(made.secret)
    run = api.post("/v1/runs", json={"agent": GUARDED, "input": "go"}, headers=auth).json()
    stub.drain(secure_rt)
    pending = api.get(f"/v1/runs/{run['id']}", headers=auth).json()["pending"]
    bad = {
        "approval_id": pending["approval_id"],
        "decisions": [{"call_id": "w1", "action": "edit", "arguments": {"item": 3}}],
    }
    refused = api.post(f"/v1/runs/{run['id']}/approval", json=bad, headers=auth)
    assert refused.status_code == 422 and "write_thing" in refused.text
    both = {**bad, "approve": "all"}
    assert api.post(f"/v1/runs/{run['id']}/approval", json=both, headers=auth).status_code == 422
    body = {
        "approval_id": pending["approval_id"],
        "decisions": [
            {"call_id": "w1", "action": "edit", "arguments": {"item": "A2"}},
            {"call_id": "w2", "action": "reject", "message": "no B"},
        ],
        "note": "thanks",
    }
    ok = api.post(f"/v1/runs/{run['id']}/approval", json=body, headers=auth)
    assert ok.status_code == 200, ok.text
    stub.drain(secure_rt)
    with secure_rt.engine.connect() as conn:
        calls = {c.call_id: c for c in call_store.list_tool_calls(conn, run["id"])}
        resumed = [e for e in records.list_events(conn, run["id"]) if e["type"] == "run.resumed"]
    assert (calls["w1"].data or {})["decision"]["by"] == made.key.id
    assert (calls["w2"].data or {})["decision"]["message"] == "no B"
    assert resumed[0]["data"]["by"] == made.key.id
    msgs = api.get(f"/v1/runs/{run['id']}/messages", headers=auth).json()["messages"]
    assert [m["content"] for m in msgs if m["role"] == "tool"][1] == "Declined by user: no B"
    assert api.get(f"/v1/runs/{run['id']}", headers=auth).json()["status"] == "completed"


def test_a_second_different_decision_is_409_the_same_one_200(
    api: TestClient, secure_rt: Runtime, stub: StubBroker
) -> None:
    # SPEC N-4: as answers do: the same decisions again → 200 (idempotent); different ones →
    # 409 with the error shape, and the first decisions stand
    with secure_rt.engine.begin() as conn:
        made = keys.create_key(conn, "acme", keys.DEFAULT_SCOPES)
    auth = bearer(made.secret)
    run = api.post("/v1/runs", json={"agent": GUARDED, "input": "go"}, headers=auth).json()
    stub.drain(secure_rt)
    apr = api.get(f"/v1/runs/{run['id']}", headers=auth).json()["pending"]["approval_id"]
    url = f"/v1/runs/{run['id']}/approval"
    first = {"approval_id": apr, "approve": ["w1"], "reject": ["w2"]}
    assert api.post(url, json=first, headers=auth).status_code == 200
    again = api.post(url, json=first, headers=auth)
    assert again.status_code == 200 and again.json()["id"] == run["id"]
    other = api.post(url, json={"approval_id": apr, "approve": "all"}, headers=auth)
    assert other.status_code == 409, other.text
    assert other.json()["error"]["code"] == "conflict"
    assert "already decided otherwise" in other.json()["error"]["message"]
    stub.drain(secure_rt)
    msgs = api.get(f"/v1/runs/{run['id']}/messages", headers=auth).json()["messages"]
    assert [m["content"] for m in msgs if m["role"] == "tool"] == ["wrote A", "Declined by user"]
