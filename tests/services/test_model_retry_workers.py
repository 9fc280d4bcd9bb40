"""Transient model errors retried by the real Celery round task (SPEC M-8)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from scheduler.app import create_app
from shared.engine.runtime import Runtime
from shared.llm.fake_server import FakeLLMServer, ReplySpec
from tests.support import WorkerProcs, wait_for


def test_429_retry_after_is_honoured_by_the_worker(prod_rt: Runtime, workers: WorkerProcs) -> None:
    workers.start("alpha")
    with FakeLLMServer() as llm, TestClient(create_app(lambda: prod_rt)) as client:
        llm.script(
            ReplySpec(
                status=429,
                headers={"Retry-After": "2"},
                body={"error": {"message": "rate limited"}},
            ),
            ReplySpec(text="after the wait"),
        )
        agent = {
            "kind": "chat",
            "model": {"provider": "openai", "base_url": llm.base_url, "model": "m"},
        }
        run = client.post("/v1/runs", json={"agent": agent, "input": "hi"}).json()
        done = wait_for(
            lambda: (
                (r := client.get(f"/v1/runs/{run['id']}").json())["status"]
                in ("completed", "failed")
                and r
            ),
            30,
        )
        first, second = llm.requests[0], llm.requests[1]
    assert done["status"] == "completed" and done["result"]["text"] == "after the wait"
    assert second.at - first.at >= 2.0, second.at - first.at
