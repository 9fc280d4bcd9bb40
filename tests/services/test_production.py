"""Production mode: Redis broker, PostgreSQL, the API in-process, two `celery worker`
processes."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import redis
from fastapi.testclient import TestClient

from scheduler.app import create_app
from shared.engine.runtime import Runtime
from shared.names import ROUND_TASK, ROUNDS_QUEUE
from shared.priorities import queue_keys
from shared.wiring import task_args
from tests.support import WorkerProcs, model_calls, wait_for

CHAT = {"kind": "chat", "model": {"provider": "scripted", "replies": [{"text": "done"}]}}
SLOW = {
    "kind": "chat",
    "model": {"provider": "scripted", "replies": [{"text": "ok", "sleep": 1.0}]},
}


def _statuses(client: TestClient, ids: list[str]) -> Counter[str]:
    return Counter(client.get(f"/v1/runs/{i}").json()["status"] for i in ids)


def test_fifty_runs_two_workers_each_round_once(
    prod_rt: Runtime, workers: WorkerProcs, call_log: Path
) -> None:
    workers.start("alpha")
    workers.start("beta")
    with TestClient(create_app(lambda: prod_rt)) as client:
        ids = [
            client.post("/v1/runs", json={"agent": CHAT, "input": f"question {i}"}).json()["id"]
            for i in range(50)
        ]
        wait_for(lambda: _statuses(client, ids)["completed"] == 50, 60, what="50 completed runs")
        runs = [client.get(f"/v1/runs/{i}").json() for i in ids]
    assert all(r["result"]["text"] == "done" for r in runs)
    calls = model_calls(call_log)
    assert len(calls) == 50, f"expected one model call per run, saw {len(calls)}"
    pids = Counter(line.split()[1] for line in calls)
    assert len(pids) == 2, f"both worker processes should have taken rounds: {pids}"


def test_duplicate_delivery_executes_round_once(
    prod_rt: Runtime, workers: WorkerProcs, call_log: Path
) -> None:
    workers.start("alpha")
    workers.start("beta")
    captured: list = []
    real_publish = prod_rt.publish
    prod_rt.publish = lambda items: (captured.extend(items), real_publish(items))  # type: ignore[assignment]
    with TestClient(create_app(lambda: prod_rt)) as client:
        run = client.post("/v1/runs", json={"agent": SLOW, "input": "hi"}).json()
        (dispatch,) = captured
        celery_app = real_publish.app  # type: ignore[attr-defined]
        for _ in range(2):  # the same message twice more, while the first is in flight
            celery_app.send_task(ROUND_TASK, args=task_args(dispatch))
        wait_for(lambda: client.get(f"/v1/runs/{run['id']}").json()["status"] == "completed", 30)
        # and once more after it committed
        celery_app.send_task(ROUND_TASK, args=task_args(dispatch))
        time.sleep(1.5)  # give the duplicate time to be consumed (and dropped)
        msgs = client.get(f"/v1/runs/{run['id']}/messages").json()["messages"]
    assert len(model_calls(call_log)) == 1
    assert [m["role"] for m in msgs] == ["user", "assistant"]


def test_cancelled_runs_queued_round_does_nothing(
    prod_rt: Runtime, workers: WorkerProcs, call_log: Path
) -> None:
    with TestClient(create_app(lambda: prod_rt)) as client:
        run = client.post("/v1/runs", json={"agent": CHAT, "input": "hi"}).json()
        assert client.post(f"/v1/runs/{run['id']}/cancel").json()["status"] == "cancelled"
        workers.start("alpha")  # the round message was queued before the cancel
        r = redis.Redis.from_url(prod_rt.settings.broker_url)
        keys = [f"{prod_rt.settings.broker_prefix}{k}" for k in queue_keys(ROUNDS_QUEUE)]
        wait_for(lambda: sum(r.llen(k) for k in keys) == 0, 20, what="queue drained")
        time.sleep(1.0)
        assert client.get(f"/v1/runs/{run['id']}").json()["status"] == "cancelled"
    assert model_calls(call_log) == []
