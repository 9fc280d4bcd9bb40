"""A read run in the round's own task (opted in: ``TREADLE_WORKER_READ_TOOLS_IN_ROUND``), its
worker SIGKILLed during the read: the round's model reply was not committed, so the round
runs again — model call and read included — and commits once; the killed call is billed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from scheduler.app import create_app
from scheduler.embedded import ReaperLoop
from shared.engine.runtime import Runtime
from shared.store.tables import usage
from tests.support import (
    EffectServer,
    WorkerProcs,
    model_calls,
    quick_recovery,
    record_tool,
    wait_for,
)

pytestmark = pytest.mark.services

IN_ROUND = {"TREADLE_WORKER_READ_TOOLS_IN_ROUND": "true"}


@pytest.fixture
def endpoint() -> Iterator[EffectServer]:
    with EffectServer(delay=2.0) as server:  # a slow read: the kill lands during it
        yield server


@pytest.fixture
def fast_recovery(endpoint: EffectServer) -> dict[str, str]:
    return quick_recovery(f"127.0.0.1:{endpoint.port}")


def test_a_worker_killed_during_a_read_in_the_round(
    prod_rt: Runtime, workers: WorkerProcs, endpoint: EffectServer, call_log: Path
) -> None:
    lookup = {**record_tool(endpoint.url), "name": "lookup", "read_only": True}
    agent = {
        "kind": "agent",
        "tools": [lookup],
        "model": {
            "provider": "scripted",
            "replies": [
                {"tool_calls": [{"id": "r1", "name": "lookup", "arguments": {"item": "A"}}]},
                {"text": "Found A."},
            ],
        },
    }
    reaper = ReaperLoop(prod_rt, 0.5).start()
    try:
        workers.start("alpha", env=IN_ROUND)
        with TestClient(create_app(lambda: prod_rt)) as client:
            run = client.post("/v1/runs", json={"agent": agent, "input": "look A up"}).json()
            assert endpoint.received.wait(20), "the read never reached the endpoint"
            workers.kill("alpha")  # during the read, in the round's own task
            workers.start("beta", env=IN_ROUND)
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
    assert done["result"]["text"] == "Found A."
    assert endpoint.hits[f"{run['id']}:r1"] == 2  # the read ran again with its round
    assert [m["role"] for m in msgs] == ["user", "assistant", "tool", "assistant"]
    assert [m["content"] for m in msgs if m["role"] == "tool"] == ['{"recorded": "A"}']
    assert len(model_calls(call_log)) == 3, "round 1 twice (its reply was lost), round 2 once"
    assert sum(m["role"] == "assistant" for m in msgs) == 2, "each round committed once"
    with prod_rt.engine.connect() as conn:
        q = sa.select(usage.c.round, usage.c.committed).where(usage.c.run_id == run["id"])
        rows = conn.execute(q.order_by(usage.c.id)).mappings().all()
    assert [(r["round"], r["committed"]) for r in rows] == [(1, False), (1, True), (2, True)]
