"""The schedule fields of a run body, and the crons routes, on SQLite."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi.testclient import TestClient

from shared.engine import schedule
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker

CHAT = {"kind": "chat", "model": {"provider": "scripted", "replies": [{"text": "hi"}]}}


def _run(**extra: Any) -> dict[str, Any]:
    return {"agent": CHAT, "input": "hi", **extra}


def test_run_at_and_delay_s(client: TestClient, stub: StubBroker, sqlite_rt: Runtime) -> None:
    at = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    run = client.post("/v1/runs", json=_run(run_at=at)).json()
    assert run["status"] == "scheduled" and run["run_at"].startswith(at[:16])
    assert client.post("/v1/runs", json=_run(delay_s=30)).json()["status"] == "scheduled"
    assert stub.sent == []
    listed = client.get("/v1/runs", params={"status": "scheduled"}).json()["runs"]
    assert len(listed) == 2
    # a past time starts now; delay 0 too
    past = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    assert client.post("/v1/runs", json=_run(run_at=past)).json()["status"] == "queued"
    assert client.post("/v1/runs", json=_run(delay_s=0)).json()["status"] == "queued"
    assert schedule.release_due(sqlite_rt) == 0
    cancelled = client.post(f"/v1/runs/{run['id']}/cancel").json()
    assert cancelled["status"] == "cancelled"


def test_bad_schedule_fields_are_422(client: TestClient, stub: StubBroker) -> None:
    at = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    thread = client.post("/v1/threads", json={}).json()["id"]
    for body in (
        _run(run_at=at, delay_s=5),
        _run(delay_s=-1),
        _run(delay_s=367 * 86400),
        _run(run_at="2030-01-01T00:00:00"),  # no timezone
        _run(run_at=at, thread_id=thread),
        _run(priority=10),
        _run(priority=-1),
        _run(ttl_s=0),
    ):
        r = client.post("/v1/runs", json=body)
        assert r.status_code == 422, (body, r.text)
    assert client.get("/v1/runs").json()["runs"] == []
    assert stub.sent == []


def test_crons_create_list_get_pause_delete(client: TestClient, sqlite_rt: Runtime) -> None:
    body = {"agent": CHAT, "input": "tick", "schedule": "*/5 * * * *", "timezone": "Europe/Paris"}
    r = client.post("/v1/crons", json={**body, "metadata": {"k": 1}})
    assert r.status_code == 201, r.text
    cron = r.json()
    assert cron["id"].startswith("cron_") and cron["paused"] is False
    assert cron["next_run_at"] and cron["schedule"] == "*/5 * * * *"
    assert client.get(f"/v1/crons/{cron['id']}").json()["id"] == cron["id"]
    assert [c["id"] for c in client.get("/v1/crons").json()["crons"]] == [cron["id"]]
    paused = client.patch(f"/v1/crons/{cron['id']}", json={"paused": True}).json()
    assert paused["paused"] is True and paused["next_run_at"] is None
    assert schedule.fire_crons(sqlite_rt, 4e9) == 0  # a paused cron never fires
    resumed = client.patch(f"/v1/crons/{cron['id']}", json={"paused": False}).json()
    assert resumed["next_run_at"]
    assert client.delete(f"/v1/crons/{cron['id']}").status_code == 204
    assert client.get(f"/v1/crons/{cron['id']}").status_code == 404
    assert client.delete(f"/v1/crons/{cron['id']}").status_code == 404


def test_bad_crons_are_refused_writing_nothing(client: TestClient) -> None:
    ok = {"agent": CHAT, "input": "tick", "schedule": "0 9 * * *"}
    for body, status in (
        ({**ok, "schedule": "61 * * * *"}, 422),
        ({**ok, "schedule": "* * * *"}, 422),
        ({**ok, "schedule": "0 0 31 2 *"}, 422),  # never happens
        ({**ok, "schedule": "5-3 * * * *"}, 422),
        ({**ok, "timezone": "Mars/Olympus"}, 422),
        ({**ok, "thread_id": "thr_nope"}, 404),
        ({**ok, "agent": "no-such-agent"}, 404),
    ):
        r = client.post("/v1/crons", json=body)
        assert r.status_code == status, (body, r.text)
    assert client.get("/v1/crons").json()["crons"] == []


def test_a_cron_fires_runs_with_its_metadata(
    client: TestClient, sqlite_rt: Runtime, stub: StubBroker
) -> None:
    cron = client.post(
        "/v1/crons",
        json={"agent": CHAT, "input": "tick", "schedule": "* * * * *", "metadata": {"k": 1}},
    ).json()
    assert schedule.fire_crons(sqlite_rt, 4e9) == 1
    stub.drain(sqlite_rt)
    runs = client.get("/v1/runs").json()["runs"]
    assert len(runs) == 1 and runs[0]["status"] == "completed"
    assert runs[0]["metadata"]["cron_id"] == cron["id"] and runs[0]["metadata"]["k"] == 1
    assert client.get(f"/v1/crons/{cron['id']}").json()["last_run_id"] == runs[0]["id"]


def test_crons_are_tenant_scoped(sqlite_rt: Runtime) -> None:
    from scheduler.app import create_app
    from shared.store import keys

    with sqlite_rt.engine.begin() as conn:
        a = keys.create_key(conn, "acme", [keys.READ, keys.WRITE]).secret
        b = keys.create_key(conn, "bravo", [keys.READ, keys.WRITE]).secret
    with TestClient(create_app(lambda: sqlite_rt, auth="required")) as c:
        ha, hb = {"Authorization": f"Bearer {a}"}, {"Authorization": f"Bearer {b}"}
        body = {"agent": CHAT, "input": "tick", "schedule": "0 9 * * *"}
        cron = c.post("/v1/crons", json=body, headers=ha).json()
        assert c.get(f"/v1/crons/{cron['id']}", headers=hb).status_code == 404
        assert c.get("/v1/crons", headers=hb).json()["crons"] == []
        assert (
            c.patch(f"/v1/crons/{cron['id']}", json={"paused": True}, headers=hb).status_code == 404
        )
        assert c.delete(f"/v1/crons/{cron['id']}", headers=hb).status_code == 404
        assert c.get(f"/v1/crons/{cron['id']}", headers=ha).status_code == 200
        assert c.post("/v1/crons", json=body).status_code == 401
