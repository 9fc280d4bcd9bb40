"""Progress from tools: a plugin tool's ``ctx.progress`` reports reach the run's SSE stream
as ``tool.progress`` events, live (no id, not stored), in order; the sink bounds them."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import httpx
import pytest

from shared.engine.livebus import InProcessBus
from shared.engine.progress import MAX_MESSAGE, MAX_REPORTS, progress_sink
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.store import records
from shared.store.rows import Call, CallStatus
from tests.live import ApiServer, Pump, read_sse

PROGRESSIVE = {
    "kind": "agent",
    "tools": ["progressive"],
    "model": {
        "provider": "scripted",
        "replies": [
            {"tool_calls": [{"id": "p1", "name": "progressive", "arguments": {"delay": 1.0}}]},
            {"text": "Done."},
        ],
    },
}


@pytest.fixture
def server(sqlite_rt: Runtime, stub: StubBroker) -> Iterator[str]:
    with ApiServer(sqlite_rt) as api, Pump(sqlite_rt, stub):
        yield api.url


def test_five_progress_reports_reach_sse_in_order(server: str, sqlite_rt: Runtime) -> None:
    got = httpx.post(f"{server}/v1/runs", json={"agent": PROGRESSIVE, "input": "go"}, timeout=10)
    assert got.status_code == 201, got.text
    run_id = got.json()["id"]
    frames, status = read_sse(f"{server}/v1/runs/{run_id}/events")
    assert status == 200 and frames[-1].event == "run.completed"
    progress = [f for f in frames if f.event == "tool.progress"]
    assert [p.data["seq"] for p in progress] == [1, 2, 3, 4, 5]
    assert [(p.data["progress"], p.data["total"]) for p in progress] == [
        (float(i), 5.0) for i in range(1, 6)
    ]
    assert progress[0].data["message"] == "step 1 of 5"
    assert {(p.data["call_id"], p.data["name"], p.data["run_id"]) for p in progress} == {
        ("p1", "progressive", run_id)
    }
    assert all(p.id is None for p in progress)  # live: no id, never replayed
    order = [
        f.event for f in frames if f.event in ("tool.started", "tool.progress", "tool.finished")
    ]
    assert order == ["tool.started"] + ["tool.progress"] * 5 + ["tool.finished"]
    with sqlite_rt.engine.connect() as conn:
        assert "tool.progress" not in {e["type"] for e in records.list_events(conn, run_id)}


def test_the_sink_bounds_what_a_tool_reports(sqlite_rt: Runtime) -> None:
    bus = InProcessBus()
    seen: list[dict[str, Any]] = []
    bus.subscribe("run_x", seen.append)
    rt = replace(sqlite_rt, live=bus)
    call = Call("run_x", "c1", 2, 0, "t", "{}", True, CallStatus.RUNNING)
    sink = progress_sink(rt, "run_x", call)
    sink(math.nan, -1.0, "x" * 10_000)
    sink(True, math.inf, None)  # type: ignore[arg-type]
    for _ in range(MAX_REPORTS + 10):
        sink(0.5, 1.0, "ok")
    assert len(seen) == MAX_REPORTS
    first, second = seen[0]["data"], seen[1]["data"]
    assert "progress" not in first and "total" not in first
    assert len(first["message"]) == MAX_MESSAGE
    assert set(second) == {"call_id", "name", "round", "seq"}
    assert seen[-1]["data"]["seq"] == MAX_REPORTS and seen[0]["type"] == "tool.progress"
