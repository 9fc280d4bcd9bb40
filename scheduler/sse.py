"""SSE for ``GET /v1/runs/{id}/events``: replay durable events after Last-Event-ID, then tail
them live (live model deltas interleaved, without ids); heartbeats; ends after the terminal
event."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.concurrency import run_in_threadpool

from shared.engine.runtime import Runtime
from shared.store import repo

__all__ = ["TERMINAL", "event_stream", "format_event"]

TERMINAL = frozenset({"run.completed", "run.failed", "run.cancelled"})
HEARTBEAT_S = 15.0
POLL_S = 0.5


def format_event(type_: str, data: Any, seq: int | None = None) -> str:
    head = f"id: {seq}\n" if seq is not None else ""
    return f"{head}event: {type_}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def _fetch(rt: Runtime, run_id: str, after: int) -> list[dict[str, Any]]:
    with rt.engine.connect() as conn:
        return [dict(r) for r in repo.list_events(conn, run_id, after)]


async def event_stream(rt: Runtime, run_id: str, after: int) -> AsyncIterator[str]:
    loop = asyncio.get_running_loop()
    live: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=10_000)

    def on_live(event: dict[str, Any]) -> None:
        loop.call_soon_threadsafe(_put, live, event)

    cancel = rt.live.subscribe(run_id, on_live)
    cursor, last_beat = after, time.monotonic()
    try:
        yield ": connected\n\n"
        while True:
            for ev in await run_in_threadpool(_fetch, rt, run_id, cursor):
                cursor = ev["seq"]
                yield format_event(ev["type"], {"seq": ev["seq"], "run_id": run_id,
                                                "data": ev["data"], "ts": ev["created_at"]},
                                   ev["seq"])
                if ev["type"] in TERMINAL:
                    return
            try:
                item = await asyncio.wait_for(live.get(), timeout=POLL_S)
                if item.get("type", "").endswith(".delta"):
                    yield format_event(item["type"], {"run_id": run_id, **item.get("data", {})})
            except TimeoutError:
                pass
            if time.monotonic() - last_beat >= HEARTBEAT_S:
                last_beat = time.monotonic()
                yield ": heartbeat\n\n"
    finally:
        cancel()


def _put(q: asyncio.Queue[dict[str, Any]], event: dict[str, Any]) -> None:
    if not q.full():
        q.put_nowait(event)
