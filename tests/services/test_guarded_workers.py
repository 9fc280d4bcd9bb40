"""A worker SIGKILLed while executing an approved write:
the endpoint sees at most one completed effect per idempotency key, and the run completes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from scheduler.app import create_app
from scheduler.embedded import ReaperLoop
from shared.engine.runtime import Runtime
from tests.support import EffectServer, WorkerProcs, quick_recovery, record_tool, wait_for


@pytest.fixture
def effects() -> Iterator[EffectServer]:
    with EffectServer(delay=1.5) as server:
        yield server


@pytest.fixture
def fast_recovery(effects: EffectServer) -> dict[str, str]:
    return quick_recovery(f"127.0.0.1:{effects.port}")


def test_kill_during_approved_write(
    prod_rt: Runtime, workers: WorkerProcs, effects: EffectServer
) -> None:
    agent = {
        "kind": "agent",
        "guarded": True,
        "tools": [record_tool(effects.url)],
        "model": {
            "provider": "scripted",
            "replies": [
                {"tool_calls": [{"id": "w1", "name": "record", "arguments": {"item": "A"}}]},
                {"text": "Recorded A."},
            ],
        },
    }
    reaper = ReaperLoop(prod_rt, 0.5).start()
    try:
        workers.start("alpha")
        with TestClient(create_app(lambda: prod_rt)) as client:
            run = client.post("/v1/runs", json={"agent": agent, "input": "record A"}).json()
            waiting = wait_for(
                lambda: (
                    (x := client.get(f"/v1/runs/{run['id']}").json())["status"] == "waiting" and x
                ),
                30,
            )
            apr = waiting["pending"]["approval_id"]
            client.post(
                f"/v1/runs/{run['id']}/approval", json={"approval_id": apr, "approve": "all"}
            )
            assert effects.received.wait(20), "the write never reached the endpoint"
            workers.kill("alpha")  # mid-request: the endpoint will still apply the effect
            workers.start("beta")
            done = wait_for(
                lambda: (
                    (x := client.get(f"/v1/runs/{run['id']}").json())["status"] == "completed" and x
                ),
                60,
                what="completed after the kill",
            )
            msgs = client.get(f"/v1/runs/{run['id']}/messages").json()["messages"]
    finally:
        reaper.stop()
    key = f"{run['id']}:w1"
    assert effects.effects == {key: 1}, effects.effects
    assert effects.hits[key] == 2, "the re-driven call reused the same idempotency key"
    assert done["result"]["text"] == "Recorded A."
    assert [m["content"] for m in msgs if m["role"] == "tool"] == ['{"recorded": "A"}']
