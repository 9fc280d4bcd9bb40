"""Fleet-wide limits with 3 worker processes × 16 threads."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from scheduler.app import create_app
from shared.engine.runtime import Runtime
from shared.llm.fake_server import FakeLLMServer, ReplySpec
from shared.llm.ratelimit import RedisLimiter
from tests.support import WorkerProcs, wait_for


def _start(workers: WorkerProcs) -> None:
    workers.start_many(["alpha", "beta", "gamma"], concurrency=16)


def _all_done(client: TestClient, ids: list[str]) -> bool:
    return all(client.get(f"/v1/runs/{i}").json()["status"] == "completed" for i in ids)


def _limited(prod_rt: Runtime) -> Runtime:
    s = prod_rt.settings
    prod_rt.limiter = RedisLimiter(s.broker_url, prefix=f"{s.broker_prefix}treadle:limit:")
    return prod_rt


def test_max_concurrent_holds_across_the_fleet(prod_rt: Runtime, workers: WorkerProcs) -> None:
    _start(workers)
    with (
        FakeLLMServer(lambda body: ReplySpec(text="ok", first_byte_latency=0.3)) as llm,
        TestClient(create_app(lambda: _limited(prod_rt))) as client,
    ):
        agent: dict[str, Any] = {
            "kind": "chat",
            "model": {
                "provider": "openai",
                "base_url": llm.base_url,
                "model": "m",
                "max_concurrent": 4,
            },
        }
        ids = [
            client.post("/v1/runs", json={"agent": agent, "input": f"q{i}"}).json()["id"]
            for i in range(30)
        ]
        wait_for(lambda: _all_done(client, ids), 90, interval=0.2, what="30 runs")
        peak = llm.max_concurrency
    assert len(llm.requests) == 30
    assert peak <= 4, f"the fake server saw {peak} concurrent requests"
    assert peak >= 2, "the limit should still allow concurrency"


def test_429_pauses_the_profile_fleet_wide(prod_rt: Runtime, workers: WorkerProcs) -> None:
    _start(workers)
    state = {"n": 0}

    def responder(body: dict[str, Any]) -> ReplySpec:
        state["n"] += 1
        if state["n"] == 3:
            return ReplySpec(
                status=429,
                headers={"Retry-After": "3"},
                body={"error": {"message": "rate limited"}},
            )
        return ReplySpec(text="ok", first_byte_latency=0.2)

    with (
        FakeLLMServer(responder) as llm,
        TestClient(create_app(lambda: _limited(prod_rt))) as client,
    ):
        agent: dict[str, Any] = {
            "kind": "chat",
            "model": {
                "provider": "openai",
                "base_url": llm.base_url,
                "model": "m",
                "max_concurrent": 2,
            },
        }
        ids = [
            client.post("/v1/runs", json={"agent": agent, "input": f"q{i}"}).json()["id"]
            for i in range(12)
        ]
        wait_for(lambda: _all_done(client, ids), 90, interval=0.2, what="12 runs")
        times = [r.at for r in llm.requests]
    t429 = times[2]
    during = [t - t429 for t in times if t429 + 0.3 < t < t429 + 2.9]
    assert during == [], f"requests reached the profile during the pause: {during}"
    assert any(t >= t429 + 3 for t in times), "requests resumed after the pause"
