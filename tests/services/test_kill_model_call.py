"""A worker SIGKILLed mid model call: the round re-runs
(a second model request) but commits once; the usage table bills both calls honestly."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from scheduler.app import create_app
from scheduler.embedded import ReaperLoop
from shared.engine.runtime import Runtime
from shared.store.tables import messages, usage
from tests.support import WorkerProcs, model_calls, quick_recovery, wait_for


def _status(client: TestClient, run_id: str) -> str:
    return str(client.get(f"/v1/runs/{run_id}").json()["status"])


@pytest.fixture
def fast_recovery() -> dict[str, str]:
    return quick_recovery()


def test_kill_mid_model_call_reruns_commits_once_bills_both(
    prod_rt: Runtime, workers: WorkerProcs, call_log: Path
) -> None:
    slow = {
        "kind": "chat",
        "model": {"provider": "scripted", "replies": [{"text": "finally", "sleep": 2.0}]},
    }
    workers.start("alpha")
    reaper = ReaperLoop(prod_rt, 0.5).start()
    try:
        with TestClient(create_app(lambda: prod_rt)) as client:
            run = client.post("/v1/runs", json={"agent": slow, "input": "hi"}).json()
            wait_for(lambda: len(model_calls(call_log)) == 1, 20, what="the model call")
            workers.kill("alpha")  # SIGKILL mid model call
            workers.start("beta")
            wait_for(lambda: _status(client, run["id"]) == "completed", 60, what="completed")
    finally:
        reaper.stop()
    assert len(model_calls(call_log)) == 2, "the round re-ran: a second model request"
    with prod_rt.engine.connect() as conn:
        rows = (
            conn.execute(sa.select(usage).where(usage.c.run_id == run["id"]).order_by(usage.c.id))
            .mappings()
            .all()
        )
        assistants = conn.execute(
            sa.select(sa.func.count())
            .select_from(messages)
            .where(messages.c.run_id == run["id"], messages.c.role == "assistant")
        ).scalar_one()
    assert assistants == 1, "committed once"
    assert [(r["round"], r["committed"]) for r in rows] == [(1, False), (1, True)]
    assert rows[0]["input_tokens"] > 0 and rows[0]["estimated"], "the killed call is billed"
