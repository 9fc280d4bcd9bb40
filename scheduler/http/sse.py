"""SSE for ``GET /v1/runs/{id}/events``: the run's tail (``scheduler.http.tail``) as frames.

The stream replays the durable events after the client's cursor (``Last-Event-ID`` or
``?after=``), then tails the run: ``id:`` is the event seq; model text and reasoning deltas
and tools' ``tool.progress`` are interleaved live, without an id (they are not stored, so a
reconnect does not replay them); a ``: heartbeat`` comment every 15 s; the stream ends after
the terminal event (``run.completed``, ``run.failed``, ``run.cancelled``). ``: connected`` is
sent once the tail is subscribed, so anything published after it reaches this stream.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from scheduler.http.tail import HEARTBEAT_S, POLL_S, TERMINAL, Batch, Delta, TailItem, tailing
from shared.engine.runtime import Runtime
from shared.isotime import iso, iso_times

__all__ = ["HEARTBEAT_S", "POLL_S", "SSE_HEADERS", "event_stream", "format_event"]

# an event stream's response headers: not cached, not buffered by a proxy (nginx)
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def format_event(type_: str, data: Any, seq: int | None = None) -> str:
    head = f"id: {seq}\n" if seq is not None else ""
    return f"{head}event: {type_}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def _frames(run_id: str, item: TailItem) -> str:
    if isinstance(item, Batch):
        return "".join(_durable(run_id, ev) for ev in item.events)
    if isinstance(item, Delta):
        return format_event(item.type, {"run_id": run_id, **item.data})
    return ": heartbeat\n\n"


def _durable(run_id: str, ev: dict[str, Any]) -> str:
    body = {
        "seq": ev["seq"],
        "run_id": run_id,
        "type": ev["type"],
        "data": iso_times(ev["data"]),
        "ts": iso(ev["created_at"]),
    }
    return format_event(ev["type"], body, ev["seq"])


async def event_stream(
    rt: Runtime,
    run_id: str,
    after: int,
    *,
    heartbeat: float | None = None,
    poll: float | None = None,
) -> AsyncIterator[str]:
    async with tailing(
        rt,
        run_id,
        after,
        ends=TERMINAL,
        heartbeat=heartbeat or HEARTBEAT_S,
        poll=poll or POLL_S,
    ) as items:
        yield "retry: 2000\n: connected\n\n"
        async for item in items:
            yield _frames(run_id, item)
