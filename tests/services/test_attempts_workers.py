"""Bounded attempts (L-12) through a real Celery worker on PostgreSQL + Redis: a round that
fails the same way every time (a router handler with a bug, a test plugin) is tried
``max_attempts`` times, then the run fails with the cause, an event and its webhook-ready
state; resume with a fixed spec completes it. Spec problems that can be seen at submit are a
422 before anything is written."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from scheduler.app import create_app
from shared.engine.runtime import Runtime
from tests.support import WorkerProcs, wait_for

SCRIPTED = {"provider": "scripted", "replies": [{"text": "unused"}]}


@pytest.fixture
def fast_recovery() -> dict[str, str]:
    return {"TREADLE_REAPER_INTERVAL": "0.5"}


def _status(client: TestClient, run_id: str, wanted: str, timeout: float = 60) -> Any:
    return wait_for(
        lambda: (r := client.get(f"/v1/runs/{run_id}").json())["status"] == wanted and r,
        timeout,
        what=f"{run_id} {wanted}",
    )


def test_a_poison_round_fails_at_its_bound_and_resumes_after_the_fix(
    prod_rt: Runtime, workers: WorkerProcs
) -> None:
    workers.start("alpha", concurrency=4)
    router = [{"any": ["go"], "handler": "poisoned"}]
    spec = {"kind": "agent", "model": SCRIPTED, "router": router, "max_attempts": 3}
    with TestClient(create_app(lambda: prod_rt)) as client:
        created = client.post("/v1/runs", json={"agent": spec, "input": "go"})
        assert created.status_code == 201, created.text
        run_id = created.json()["id"]
        failed = _status(client, run_id, "failed")
        assert failed["stop_reason"] == "attempts_exhausted"
        assert "poisoned handler" in failed["error"]["message"]
        assert failed["attempts"] == 3
        events = client.get(f"/v1/runs/{run_id}/events", params={"after": 0}).text
        assert events.count("event: round.started") == 3
        assert events.count("event: run.failed") == 1
        fixed = {"router": [{"any": ["go"], "handler": "echo"}]}
        resumed = client.post(f"/v1/runs/{run_id}/resume", json={"agent": fixed})
        assert resumed.status_code == 200, resumed.text
        done = _status(client, run_id, "completed")
        assert done["result"]["text"] == "Routed locally: go" and done["attempts"] == 0
