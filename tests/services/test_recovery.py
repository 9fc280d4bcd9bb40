"""Recovery by the reaper."""

from __future__ import annotations

import time

import pytest
import redis
from fastapi.testclient import TestClient

from scheduler.app import create_app
from scheduler.embedded import ReaperLoop
from shared.engine.runtime import Runtime
from tests.support import WorkerProcs, knob, wait_for

# the re-drive this test runs with: 15 s (the default is 10 s), 5 s under CI=true (a loaded
# machine; the same check, sooner)
REDRIVE_S = knob("RECOVERY_REDRIVE_S", 15, 5)

CHAT = {"kind": "chat", "model": {"provider": "scripted", "replies": [{"text": "survived"}]}}


def _status(client: TestClient, run_id: str) -> str:
    return str(client.get(f"/v1/runs/{run_id}").json()["status"])


@pytest.fixture
def fast_recovery() -> dict[str, str]:
    return {"TREADLE_REDRIVE_SECONDS": f"{REDRIVE_S:g}"}


def test_flushed_round_message_resumes_within_the_reaper_interval(
    prod_rt: Runtime, workers: WorkerProcs
) -> None:
    """A 15 s re-drive (the default is 10 s; 5 s under CI=true, ``RECOVERY_REDRIVE_S``), the
    default reaper pass (every 2 s): the worker keeps running while the broker loses every
    queue; the run still completes, within re-drive + one reaper pass."""
    assert prod_rt.settings.redrive_seconds == REDRIVE_S
    assert prod_rt.settings.reaper_interval == 2
    workers.start("alpha")
    reaper = ReaperLoop(prod_rt, prod_rt.settings.reaper_interval).start()
    try:
        with TestClient(create_app(lambda: prod_rt)) as client:
            assert _status(
                client, client.post("/v1/runs", json={"agent": CHAT, "input": "warm"}).json()["id"]
            ) in ("queued", "running", "completed")
            time.sleep(1)
            published = prod_rt.publish
            prod_rt.publish = lambda items: None  # type: ignore[assignment]  # the message is lost
            run = client.post("/v1/runs", json={"agent": CHAT, "input": "hello"}).json()
            prod_rt.publish = published
            redis.Redis.from_url(prod_rt.settings.broker_url).flushdb()  # and the broker too
            t0 = time.monotonic()
            wait_for(
                lambda: _status(client, run["id"]) == "completed",
                40,
                interval=0.2,
                what="the reaper to re-drive the run",
            )
            took = time.monotonic() - t0
    finally:
        reaper.stop()
    print(
        f"\nrecovered a lost round message in {took:.1f}s (re-drive {REDRIVE_S:g} s + reaper 2 s)"
    )
    assert took <= REDRIVE_S + 5 + 5
