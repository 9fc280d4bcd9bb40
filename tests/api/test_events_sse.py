"""SSE ``GET /v1/runs/{id}/events`` against a real uvicorn server with an httpx
streaming client; a pump drives the stub broker like a worker would."""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from scheduler.http import sse
from shared.engine.runtime import InProcessBus, Runtime
from shared.engine.testing import StubBroker
from shared.isotime import epoch
from shared.llm.fake_server import FakeLLMServer, ReplySpec
from shared.store import records
from tests.engine.helpers import agent, call
from tests.live import ApiServer, Frame, Pump, read_sse


class TimingBus(InProcessBus):
    """Records when each live delta was published (to measure delta → client latency)."""

    def __init__(self) -> None:
        super().__init__()
        self.published: list[tuple[str, float]] = []

    def publish(self, run_id: str, event: dict[str, Any]) -> None:
        if event.get("type") == "text.delta":
            self.published.append((event["data"]["text"], time.time()))
        super().publish(run_id, event)


@pytest.fixture
def rt(sqlite_rt: Runtime, stub: StubBroker) -> Runtime:
    return Runtime(
        engine=sqlite_rt.engine, settings=sqlite_rt.settings, publish=stub, live=TimingBus()
    )


@pytest.fixture
def server(rt: Runtime, stub: StubBroker) -> Iterator[str]:
    with ApiServer(rt) as api, Pump(rt, stub):
        yield api.url


def _slow_tool_agent(rounds: int = 4, sleep: float = 0.25) -> dict[str, Any]:
    replies: list[dict[str, Any]] = [
        {"sleep": sleep, "tool_calls": [call("echo", {"text": f"t{i}"}, f"c{i}")]}
        for i in range(rounds)
    ]
    replies.append({"sleep": sleep, "text": "All done."})
    return agent(replies, tools=["echo"]).model_dump(mode="json", exclude_none=True)


def _submit(url: str, spec: dict[str, Any], text: str = "go") -> str:
    r = httpx.post(f"{url}/v1/runs", json={"agent": spec, "input": text}, timeout=10)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def _durable(frames: list[Frame]) -> list[Frame]:
    return [f for f in frames if f.id is not None]


def _db_events(rt: Runtime, run_id: str) -> list[tuple[int, str]]:
    with rt.engine.connect() as conn:
        return [(e["seq"], e["type"]) for e in records.list_events(conn, run_id)]


def test_reconnect_with_last_event_id_gets_every_event_once_in_order(
    server: str, rt: Runtime
) -> None:
    run_id = _submit(server, _slow_tool_agent())
    url = f"{server}/v1/runs/{run_id}/events"
    seen: list[Frame] = []
    last: int | None = None
    for _ in range(3):  # read three durable events, drop the connection, miss some, come back
        frames, status = read_sse(url, last_event_id=last, stop=lambda fs: len(_durable(fs)) >= 3)
        assert status == 200
        seen += _durable(frames)
        last = seen[-1].id
        time.sleep(0.3)
    frames, status = read_sse(url, last_event_id=last)  # to the end: the server closes
    assert status == 200
    seen += _durable(frames)
    assert seen[-1].event == "run.completed"
    expected = _db_events(rt, run_id)
    assert [(f.id, f.event) for f in seen] == expected  # every event, once, in order
    assert [s for s, _ in expected] == list(range(1, len(expected) + 1))
    assert {"round.started", "tool.started", "tool.finished"} <= {t for _, t in expected}
    assert all(f.data["seq"] == f.id and f.data["run_id"] == run_id for f in seen)
    # after the terminal event an EventSource is told to stop reconnecting
    assert read_sse(url, last_event_id=seen[-1].id)[1] == 204
    # ?after= works like Last-Event-ID
    frames, _ = read_sse(f"{url}?after={len(expected) - 2}")
    assert [f.id for f in _durable(frames)] == [len(expected) - 1, len(expected)]


def test_text_deltas_reach_the_client_while_the_model_streams(server: str, rt: Runtime) -> None:
    words = [f"w{i} " for i in range(40)]
    with FakeLLMServer() as llm:
        llm.enqueue(ReplySpec(text="".join(words), chunk_latency=0.05, first_byte_latency=0.3))
        model = {"provider": "openai", "base_url": llm.base_url, "model": "m"}
        run_id = _submit(server, {"kind": "chat", "model": model})
        frames, _ = read_sse(f"{server}/v1/runs/{run_id}/events")
    deltas = [f for f in frames if f.event == "text.delta"]
    done = next(f for f in frames if f.event == "run.completed")
    assert deltas and deltas[0].id is None  # live, not stored
    assert "".join(d.data["text"] for d in deltas) == "".join(words)
    assert done.at - deltas[0].at > 1.0  # the first delta came long before the commit
    published = rt.live.published  # type: ignore[attr-defined]
    lat = [(d.at - p[1]) * 1000 for d, p in zip(deltas, published, strict=True)]
    connected = frames[0].at  # events committed after this were tailed, not replayed
    durable = [
        (f.at - epoch(f.data["ts"])) * 1000
        for f in _durable(frames)
        if epoch(f.data["ts"]) > connected
    ]
    print(
        f"\ndelta publish->client ms: median {statistics.median(lat):.1f} max {max(lat):.1f}; "
        f"durable commit->client ms: median {statistics.median(durable):.1f} "
        f"max {max(durable):.1f}"
    )
    assert statistics.median(lat) < 100
    assert max(durable) < sse.POLL_S * 1000 * 0.8  # woken at once, not found by a poll


def test_heartbeats_while_waiting_then_the_terminal_event_ends_the_stream(
    server: str, rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sse, "HEARTBEAT_S", 0.2)
    spec = agent(
        [
            {"tool_calls": [call("ask_user", {"question": "A?", "options": ["x", "y"]}, "a1")]},
            {"text": "ok"},
        ],
        ask=True,
    )
    run_id = _submit(server, spec.model_dump(mode="json", exclude_none=True))
    url = f"{server}/v1/runs/{run_id}/events"
    frames, _ = read_sse(url, stop=lambda fs: sum(f.comment == "heartbeat" for f in fs) >= 3)
    assert [f.event for f in _durable(frames)][-1] == "run.waiting"
    t = time.time()
    r = httpx.post(f"{server}/v1/runs/{run_id}/cancel", timeout=10)
    assert r.status_code == 200
    frames, _ = read_sse(url, last_event_id=_durable(frames)[-1].id)
    assert [f.event for f in _durable(frames)] == ["run.cancelled"]
    assert frames[-1].event == "run.cancelled" and time.time() - t < 5


def test_unknown_run_is_404(server: str) -> None:
    r = httpx.get(f"{server}/v1/runs/run_nope/events", timeout=10)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
