"""A handoff with real workers (docs/handoffs.md): the worker running the triage agent's
transfer round is SIGKILLed mid model call; another worker re-runs the round and the handoff
commits once — one ``run.handoff`` event, one transfer in the transcript — and the billing
agent's write waits for approval and applies once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

import tests.plugins  # noqa: F401  (write_thing, for the API's catalog check)
from scheduler.app import create_app
from scheduler.embedded import ReaperLoop
from shared.engine.runtime import Runtime
from shared.store.tables import events, messages
from tests.support import WorkerProcs, model_calls, quick_recovery, wait_for

TRANSFER = {"id": "t1", "name": "transfer_to_billing", "arguments": {}}
WRITE = {"id": "w1", "name": "write_thing", "arguments": {"item": "refund 42"}}


def _spec() -> dict[str, Any]:
    billing = {
        "kind": "agent",
        "system_prompt": "You are billing.",
        "guarded": True,
        "tools": ["write_thing"],
        # scripted replies go by the assistant turns so far: the transfer was turn 0
        "model": {
            "provider": "scripted",
            "replies": [{"text": "unused"}, {"tool_calls": [WRITE]}, {"text": "Refunded."}],
        },
    }
    return {
        "kind": "agent",
        "system_prompt": "You are triage.",
        "model": {"provider": "scripted", "replies": [{"tool_calls": [TRANSFER], "sleep": 2.0}]},
        "handoffs": [{"name": "billing", "agent": billing}],
    }


@pytest.fixture
def fast_recovery() -> dict[str, str]:
    return quick_recovery()


def _run(client: TestClient, run_id: str) -> dict[str, Any]:
    return dict(client.get(f"/v1/runs/{run_id}").json())


def test_a_handoff_round_killed_mid_call_commits_the_handoff_once(
    prod_rt: Runtime, workers: WorkerProcs, call_log: Path, tmp_path: Path
) -> None:
    workers.start("alpha")
    reaper = ReaperLoop(prod_rt, 0.5).start()
    try:
        with TestClient(create_app(lambda: prod_rt)) as client:
            run_id = client.post("/v1/runs", json={"agent": _spec(), "input": "refund me"}).json()[
                "id"
            ]
            wait_for(lambda: len(model_calls(call_log)) == 1, 30, what="the transfer call")
            workers.kill("alpha")  # SIGKILL mid the handoff round's model call
            workers.start("beta")
            wait_for(lambda: _run(client, run_id)["status"] == "waiting", 60, what="approval")
            pending = _run(client, run_id)["pending"]
            assert [i["tool"] for i in pending["items"]] == ["write_thing"]
            body = {"approval_id": pending["approval_id"], "approve": "all"}
            r = client.post(f"/v1/runs/{run_id}/approval", json=body)
            assert r.status_code == 200, r.text
            wait_for(lambda: _run(client, run_id)["status"] == "completed", 60, what="completed")
            done = _run(client, run_id)
    finally:
        reaper.stop()
    assert done["result"]["text"] == "Refunded."
    with prod_rt.engine.connect() as conn:
        moved = conn.execute(
            sa.select(events.c.data).where(
                events.c.run_id == run_id, events.c.type == "run.handoff"
            )
        ).all()
        roles = conn.execute(
            sa.select(messages.c.role).where(messages.c.run_id == run_id).order_by(messages.c.seq)
        ).scalars()
        roles = list(roles)
    assert len(moved) == 1, "the handoff is committed once"
    assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert len(model_calls(call_log)) >= 4  # the killed call, its re-run, billing's two
    effects = (tmp_path / "effects.log").read_text().splitlines()
    assert len(effects) == 1 and effects[0].endswith("refund 42")
