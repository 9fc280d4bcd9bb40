"""Planning agent through real workers: a pause holds nothing, survives a restart of every
worker, and an answer resumes the same message chain."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import redis
from fastapi.testclient import TestClient

from scheduler.app import create_app
from shared.engine.runtime import Runtime
from shared.llm.fake_server import FakeLLMServer, ReplySpec
from shared.priorities import queue_keys
from tests.support import WorkerProcs, knob, wait_for

ASK = {
    "reason": "Need the city",
    "questions": [
        {
            "question": "Which city?",
            "options": [{"label": "Paris", "value": "paris"}, {"label": "Rome", "value": "rome"}],
        }
    ],
}


def _responder(body: dict[str, Any]) -> ReplySpec:
    n = sum(1 for m in body["messages"] if m["role"] == "assistant")
    if n == 0:
        return ReplySpec(
            tool_calls=[
                {
                    "id": "p1",
                    "name": "set_plan",
                    "arguments": {"name": "Trip", "steps": ["pick city", "book"]},
                },
                {"id": "ask1", "name": "ask_user", "arguments": ASK},
            ]
        )
    if n == 1:
        return ReplySpec(
            tool_calls=[
                {
                    "id": "p2",
                    "name": "update_plan",
                    "arguments": {
                        "updates": [{"id": "s1", "status": "done"}, {"id": "s2", "status": "done"}]
                    },
                }
            ]
        )
    return ReplySpec(text="Booked.")


def _queued(rt: Runtime) -> int:
    """Messages in the broker: queued, or delivered and not yet acknowledged."""
    r = redis.Redis.from_url(rt.settings.broker_url)
    p = rt.settings.broker_prefix
    return sum(
        int(r.llen(f"{p}{k}")) for q in ("treadle.rounds", "treadle.tools") for k in queue_keys(q)
    ) + int(r.hlen(f"{p}unacked"))


def _active_tasks(prod_rt: Runtime) -> int:
    app = prod_rt.publish.app  # type: ignore[attr-defined]
    active = app.control.inspect(timeout=2).active() or {}
    return sum(len(v) for v in active.values())


def test_pause_holds_nothing_and_survives_a_worker_restart(
    prod_rt: Runtime, workers: WorkerProcs
) -> None:
    workers.start_many(["alpha", "beta"])
    with FakeLLMServer(_responder) as llm, TestClient(create_app(lambda: prod_rt)) as client:
        agent = {
            "kind": "agent",
            "plan": True,
            "ask": True,
            "model": {"provider": "openai", "base_url": llm.base_url, "model": "m"},
        }
        run = client.post("/v1/runs", json={"agent": agent, "input": "Plan my trip"}).json()
        waiting = wait_for(
            lambda: (x := client.get(f"/v1/runs/{run['id']}").json())["status"] == "waiting" and x,
            30,
            what="waiting",
        )
        assert waiting["pending"]["kind"] == "ask" and waiting["plan"]["name"] == "Trip"
        time.sleep(0.5)
        assert _queued(prod_rt) == 0, "a waiting run must hold no queue message"
        assert _active_tasks(prod_rt) == 0, "no worker thread may be busy for it"
        workers.kill("alpha")
        workers.kill("beta")
        workers.start("gamma")
        resp = client.post(
            f"/v1/runs/{run['id']}/answer", json={"ask_id": "ask1", "answers": ["paris"]}
        )
        assert resp.status_code == 200, resp.text
        done = wait_for(
            lambda: (
                (x := client.get(f"/v1/runs/{run['id']}").json())["status"] == "completed" and x
            ),
            30,
            what="completed",
        )
        after = llm.bodies[1]["messages"]
    assert done["result"]["text"] == "Booked."
    assert [s["status"] for s in done["plan"]["steps"]] == ["done", "done"]
    tool_msgs = {m["tool_call_id"]: m["content"] for m in after if m["role"] == "tool"}
    assert "s1: pick city" in tool_msgs["p1"]  # the plan snapshot from the first round
    assert tool_msgs["ask1"] == "## Which city?\nAnswer: Paris - paris"
    assert len(llm.requests) == 3


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


# runs left waiting on an answer: 1,000 (300 under CI=true, a loaded machine), the first 100
# the baseline of the workers' memory
WAITING = int(knob("WAITING_RUNS", 1000, 300))


def test_many_waiting_runs_queue_nothing(prod_rt: Runtime, workers: WorkerProcs) -> None:
    """``WAITING`` runs paused on a question hold no queued message and no worker memory
    (growth under 25 MB per 900 more waiting runs), and each resumes on its answer."""
    workers.start_many(["alpha", "beta"], concurrency=16)
    agent = {
        "kind": "agent",
        "ask": True,
        "model": {
            "provider": "scripted",
            "replies": [
                {
                    "tool_calls": [
                        {
                            "id": "a1",
                            "name": "ask_user",
                            "arguments": {"question": "Go?", "options": ["yes", "no"]},
                        }
                    ]
                },
                {"text": "went"},
            ],
        },
    }
    pids = [p.pid for p in workers.procs.values()]

    with TestClient(create_app(lambda: prod_rt)) as client:

        def submit(n: int) -> list[str]:
            return [
                client.post("/v1/runs", json={"agent": agent, "input": f"q{i}"}).json()["id"]
                for i in range(n)
            ]

        ids = submit(100)
        wait_for(lambda: _waiting(prod_rt) == 100, 60, what="100 waiting")
        rss_100 = sum(_rss_kb(p) for p in pids)
        ids += submit(WAITING - 100)
        wait_for(lambda: _waiting(prod_rt) == WAITING, 180, interval=0.2, what=f"{WAITING} waiting")
        time.sleep(0.5)
        rss_all = sum(_rss_kb(p) for p in pids)
        assert _queued(prod_rt) == 0
        for run_id in ids:
            assert (
                client.post(
                    f"/v1/runs/{run_id}/answer", json={"ask_id": "a1", "answers": ["yes"]}
                ).status_code
                == 200
            )
        wait_for(
            lambda: _status_count(prod_rt, "completed") == WAITING,
            180,
            interval=0.2,
            what=f"{WAITING} completed",
        )
    growth_mb = (rss_all - rss_100) / 1024
    print(
        f"\nworker RSS at 100 waiting: {rss_100 / 1024:.1f} MB, at {WAITING}: "
        f"{rss_all / 1024:.1f} MB (growth {growth_mb:.1f} MB over {WAITING - 100} more waiting"
        " runs)"
    )
    limit = 25 * (WAITING - 100) / 900
    assert growth_mb < limit, f"worker memory grew {growth_mb:.1f} MB while runs waited"


def _status_count(rt: Runtime, status: str) -> int:
    import sqlalchemy as sa

    from shared.store.tables import runs

    with rt.engine.connect() as conn:
        return int(
            conn.execute(
                sa.select(sa.func.count()).select_from(runs).where(runs.c.status == status)
            ).scalar_one()
        )


def _waiting(rt: Runtime) -> int:
    return _status_count(rt, "waiting")
