"""Suspend and resume through a real worker (PostgreSQL + Redis, one ``celery worker`` with
one thread): a run suspended while its tool runs parks at the round boundary that follows —
no round runs, it holds no lease and no worker thread (another run completes on the one
thread meanwhile) — and after resume it completes."""

from __future__ import annotations

import time

import sqlalchemy as sa
from fastapi.testclient import TestClient

from scheduler.app import create_app
from shared.engine.runtime import Runtime
from shared.store.tables import events, runs
from tests.support import WorkerProcs, wait_for

SLOW_TOOL = {
    "kind": "agent",
    "tools": ["sleepy"],
    "model": {
        "provider": "scripted",
        "replies": [
            {"tool_calls": [{"id": "s1", "name": "sleepy", "arguments": {"seconds": 2}}]},
            {"text": "Rested."},
        ],
    },
}
CHAT = {"kind": "chat", "model": {"provider": "scripted", "replies": [{"text": "done"}]}}


def _types(rt: Runtime, run_id: str) -> list[str]:
    with rt.engine.connect() as conn:
        q = sa.select(events.c.type).where(events.c.run_id == run_id).order_by(events.c.seq)
        return [str(t) for t in conn.execute(q).scalars()]


def test_suspend_holds_nothing_and_resume_completes(prod_rt: Runtime, workers: WorkerProcs) -> None:
    workers.start("solo", concurrency=1)
    with TestClient(create_app(lambda: prod_rt)) as client:
        run_id = client.post("/v1/runs", json={"agent": SLOW_TOOL, "input": "rest"}).json()["id"]
        wait_for(lambda: "tool.started" in _types(prod_rt, run_id), 30, what="the tool running")
        got = client.post("/v1/runs/suspend", json={"ids": [run_id]}).json()["results"]
        assert got[0]["outcome"] == "suspending", got

        def parked() -> bool:
            view = client.get(f"/v1/runs/{run_id}").json()
            return view["status"] == "waiting" and view["pending"]["kind"] == "suspended"

        wait_for(parked, 30, what="the run parked at its round boundary")
        rounds = _types(prod_rt, run_id).count("round.started")
        # the one worker thread is free: another run completes while this one is suspended
        other = client.post("/v1/runs", json={"agent": CHAT, "input": "hi"}).json()["id"]
        wait_for(
            lambda: client.get(f"/v1/runs/{other}").json()["status"] == "completed",
            30,
            what="another run on the free thread",
        )
        time.sleep(1.0)
        assert _types(prod_rt, run_id).count("round.started") == rounds == 1  # no round ran
        with prod_rt.engine.connect() as conn:
            row = conn.execute(
                sa.select(runs.c.lease_owner, runs.c.status, runs.c.suspend_at).where(
                    runs.c.id == run_id
                )
            ).one()
        assert tuple(row) == (None, "waiting", None)
        back = client.post("/v1/runs/resume", json={"ids": [run_id]}).json()["results"]
        assert back[0]["outcome"] == "resumed"
        wait_for(
            lambda: client.get(f"/v1/runs/{run_id}").json()["status"] == "completed",
            30,
            what="the resumed run completed",
        )
        assert client.get(f"/v1/runs/{run_id}").json()["result"]["text"] == "Rested."
    kinds = [t for t in _types(prod_rt, run_id) if t.startswith(("run.", "round."))]
    assert kinds == [
        "run.queued",
        "round.started",
        "run.suspended",
        "run.resumed",
        "round.started",
        "run.completed",
    ]
