"""Live events and webhooks in production mode: PostgreSQL, Redis (broker and live
bus), two real `celery worker` processes, the API under uvicorn in this process. Deltas and
wakes cross processes on Redis pub/sub; webhooks are sent by the workers."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from standardwebhooks import Webhook

from shared.engine.livebus import RedisBus
from shared.engine.reaper import reap
from shared.engine.runtime import Runtime
from shared.isotime import epoch
from shared.llm.fake_server import FakeLLMServer, ReplySpec
from shared.store import deliveries, records
from tests.engine.helpers import agent, call
from tests.live import ApiServer, Frame, read_sse
from tests.receiver import Receiver
from tests.support import WorkerProcs, wait_for

SECRET = "whsec_" + base64.b64encode(b"production-webhook-secret-012345").decode()


@pytest.fixture
def live_rt(prod_rt: Runtime, redis_url: str) -> Runtime:
    """The production runtime with the Redis live bus, as ``treadle api`` has it."""
    return Runtime(
        engine=prod_rt.engine,
        settings=prod_rt.settings,
        publish=prod_rt.publish,
        live=RedisBus(redis_url),
    )


@pytest.fixture
def api(live_rt: Runtime) -> Iterator[str]:
    with ApiServer(live_rt) as server:
        yield server.url


def _durable(frames: list[Frame]) -> list[Frame]:
    return [f for f in frames if f.id is not None]


def _submit(url: str, body: dict[str, Any]) -> str:
    r = httpx.post(f"{url}/v1/runs", json=body, timeout=10)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def test_sse_across_processes_reconnect_exactly_once(
    api: str, live_rt: Runtime, workers: WorkerProcs
) -> None:
    workers.start_many(["alpha", "beta"])
    replies: list[dict[str, Any]] = [
        {
            "sleep": 0.2,
            "tool_calls": [call("sleepy", {"seconds": 0.1}, f"r{r}s{i}") for i in range(3)],
        }
        for r in range(3)
    ]
    spec = agent([*replies, {"sleep": 0.2, "text": "done"}], tools=["sleepy"], parallel_tools=3)
    run_id = _submit(api, {"agent": spec.model_dump(mode="json", exclude_none=True), "input": "go"})
    url = f"{api}/v1/runs/{run_id}/events"
    seen: list[Frame] = []
    for _ in range(4):
        frames, status = read_sse(
            url, last_event_id=seen[-1].id if seen else None, stop=lambda fs: len(_durable(fs)) >= 4
        )
        assert status == 200
        seen += _durable(frames)
        time.sleep(0.2)
    frames, _ = read_sse(url, last_event_id=seen[-1].id)
    seen += _durable(frames)
    with live_rt.engine.connect() as conn:
        expected = [(e["seq"], e["type"]) for e in records.list_events(conn, run_id)]
    assert seen[-1].event == "run.completed"
    assert [(f.id, f.event) for f in seen] == expected
    assert sum(t == "tool.started" for _, t in expected) == 9


def test_deltas_cross_processes_while_the_model_streams(
    api: str, live_rt: Runtime, workers: WorkerProcs
) -> None:
    workers.start("alpha")
    with FakeLLMServer() as llm:
        llm.enqueue(
            ReplySpec(
                text="".join(f"w{i} " for i in range(30)),
                chunk_latency=0.05,
                first_byte_latency=0.5,
            )
        )
        model = {"provider": "openai", "base_url": llm.base_url, "model": "m"}
        run_id = _submit(api, {"agent": {"kind": "chat", "model": model}, "input": "hi"})
        frames, _ = read_sse(f"{api}/v1/runs/{run_id}/events")
    deltas = [f for f in frames if f.event == "text.delta"]
    done = next(f for f in frames if f.event == "run.completed")
    assert len(deltas) >= 20 and done.at - deltas[0].at > 0.8
    connected = frames[0].at
    lags = [
        (f.at - epoch(f.data["ts"])) * 1000
        for f in _durable(frames)
        if epoch(f.data["ts"]) > connected
    ]
    assert lags and max(lags) < 500, lags


def test_webhook_from_a_worker_fails_twice_then_succeeds(
    live_rt: Runtime, workers: WorkerProcs, monkeypatch: pytest.MonkeyPatch
) -> None:
    receiver = Receiver(statuses=[500, 502]).start()
    workers.env.update(
        {
            "TREADLE_ALLOW_HOSTS": "127.0.0.1",
            "TREADLE_WEBHOOK_RETRY_BASE": "0.2",
            "WH_SECRET": SECRET,
        }
    )
    workers.start("alpha")
    try:
        spec = {"kind": "chat", "model": {"provider": "scripted", "replies": [{"text": "ok"}]}}
        from shared.agent.spec import AgentSpec, WebhookSpec
        from shared.engine import commands

        row, _ = commands.submit_run(
            live_rt,
            commands.RunInput(
                agent=AgentSpec.model_validate(spec),
                input="hi",
                webhook=WebhookSpec(url=receiver.url, secret_env="WH_SECRET"),
            ),
        )

        def delivered() -> bool:
            reap(live_rt)  # the beat's job: re-send webhook rows that are due
            with live_rt.engine.connect() as conn:
                ds = deliveries.list_deliveries(conn, row["id"])
            return bool(ds) and ds[0]["status"] == "delivered"

        wait_for(delivered, 30, interval=0.2, what="webhook delivered")
        assert len(receiver.received) == 3
        assert len({r.headers["webhook-id"] for r in receiver.received}) == 1
        for r in receiver.received:
            assert Webhook(SECRET).verify(r.body, r.headers)["type"] == "run.completed"
    finally:
        receiver.stop()
