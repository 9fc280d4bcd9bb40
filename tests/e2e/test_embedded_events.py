"""Live events in embedded mode (`treadle up`: API, worker and reaper in one process, the
in-process live bus): the SSE stream of a tool run, deltas included, ends by itself."""

from __future__ import annotations

import httpx

from tests.e2e.test_embedded import up_server  # noqa: F401  (the `treadle up` fixture)
from tests.live import read_sse


def test_sse_on_treadle_up(up_server: str) -> None:  # noqa: F811
    model = {
        "provider": "scripted",
        "replies": [
            {
                "tool_calls": [
                    {"id": "c1", "name": "calculator", "arguments": {"expression": "17*23"}}
                ]
            },
            {"sleep": 3.0, "text": "It is 391."},
        ],
    }  # the client is connected before the text streams
    body = {
        "agent": {"kind": "agent", "model": model, "tools": ["calculator"]},
        "input": "What is 17 * 23?",
    }
    run = httpx.post(f"{up_server}/v1/runs", json=body, timeout=10).json()
    frames, status = read_sse(f"{up_server}/v1/runs/{run['id']}/events", timeout=20)
    assert status == 200
    durable = [f.event for f in frames if f.id is not None]
    assert durable[0] == "run.queued" and durable[-1] == "run.completed"
    assert {"round.started", "tool.started", "tool.finished"} <= set(durable)
    assert [f.id for f in frames if f.id is not None] == list(range(1, len(durable) + 1))
    assert any(f.event == "text.delta" for f in frames)
    done = httpx.get(
        f"{up_server}/v1/runs/{run['id']}/events",
        headers={"Last-Event-ID": str(len(durable))},
        timeout=10,
    )
    assert done.status_code == 204
