"""SSE for ``GET /v1/runs/{id}/events`` (issue #9).

The stream replays the durable events after the client's cursor (``Last-Event-ID`` or
``?after=``), then tails the run: ``id:`` is the event seq; model text and reasoning deltas
are interleaved live, without an id (they are not stored, so a reconnect does not replay
them); a ``: heartbeat`` comment every 15 s; the stream ends after the terminal event
(``run.completed``, ``run.failed``, ``run.cancelled``).

No event is skipped or sent twice across reconnects: each durable event's seq is taken by an
UPDATE of the run's row, which holds the row lock until commit, so seqs become visible in
order, and the tail only ever reads ``seq > cursor``. The tail reads the table when a commit
wakes it (a ``wake`` message on the live bus: Redis pub/sub across API replicas, in-process
in embedded mode) and, as a fallback for a lost wake, every ``POLL_S`` seconds.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.concurrency import run_in_threadpool

from shared.engine.runtime import WAKE, Runtime
from shared.store import repo

__all__ = ["HEARTBEAT_S", "LIVE_TYPES", "POLL_S", "TERMINAL", "event_stream", "format_event"]

TERMINAL = frozenset({"run.completed", "run.failed", "run.cancelled"})
LIVE_TYPES = frozenset({"text.delta", "reasoning.delta"})
HEARTBEAT_S = 15.0
POLL_S = 1.0
BATCH = 500


def format_event(type_: str, data: Any, seq: int | None = None) -> str:
    head = f"id: {seq}\n" if seq is not None else ""
    return f"{head}event: {type_}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def _fetch(rt: Runtime, run_id: str, after: int) -> list[dict[str, Any]]:
    with rt.engine.connect() as conn:
        return [dict(r) for r in repo.list_events(conn, run_id, after, limit=BATCH)]


class _Tail:
    """The durable side of one stream: what was sent (``cursor``) and whether it ended."""

    def __init__(self, rt: Runtime, run_id: str, cursor: int) -> None:
        self.rt, self.run_id, self.cursor = rt, run_id, cursor
        self.done = False
        self.last_read = time.monotonic()

    def behind(self, seq: int | None) -> bool:
        return seq is None or seq > self.cursor

    async def read(self) -> AsyncIterator[str]:
        """Every committed event after the cursor, in seq order; stops at the terminal one."""
        self.last_read = time.monotonic()
        while not self.done:
            batch = await run_in_threadpool(_fetch, self.rt, self.run_id, self.cursor)
            for ev in batch:
                yield self._format(ev)
                if ev["type"] in TERMINAL:
                    self.done = True
                    return
            if len(batch) < BATCH:
                return

    def _format(self, ev: dict[str, Any]) -> str:
        self.cursor = ev["seq"]
        body = {"seq": ev["seq"], "run_id": self.run_id, "type": ev["type"], "data": ev["data"],
                "ts": ev["created_at"]}
        return format_event(ev["type"], body, ev["seq"])


def _put(q: asyncio.Queue[dict[str, Any]], event: dict[str, Any]) -> None:
    if not q.full():  # a client too slow for the deltas loses some; wakes are re-polled
        q.put_nowait(event)


async def _next(q: asyncio.Queue[dict[str, Any]], timeout: float) -> dict[str, Any] | None:
    try:
        return await asyncio.wait_for(q.get(), timeout=max(0.0, timeout))
    except TimeoutError:
        return None


async def event_stream(
    rt: Runtime, run_id: str, after: int, *, heartbeat: float | None = None,
    poll: float | None = None,
) -> AsyncIterator[str]:
    heartbeat = heartbeat or HEARTBEAT_S
    poll = poll or POLL_S
    loop = asyncio.get_running_loop()
    live: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=10_000)

    def on_live(event: dict[str, Any]) -> None:  # on the publisher's (or listener's) thread
        loop.call_soon_threadsafe(_put, live, event)

    # subscribe before the first read: a commit between the two still wakes this tail
    cancel = rt.live.subscribe(run_id, on_live)
    tail = _Tail(rt, run_id, after)
    try:
        yield "retry: 2000\n: connected\n\n"
        async for chunk in tail.read():
            yield chunk
        last_beat = time.monotonic()
        while not tail.done:
            now = time.monotonic()
            item = await _next(live, min(last_beat + heartbeat, tail.last_read + poll) - now)
            if item is not None and item.get("type") in LIVE_TYPES:
                yield format_event(item["type"], {"run_id": run_id, **(item.get("data") or {})})
            if (item is not None and item.get("type") == WAKE and tail.behind(item.get("seq"))) \
                    or time.monotonic() - tail.last_read >= poll:
                async for chunk in tail.read():
                    yield chunk
            if time.monotonic() - last_beat >= heartbeat:
                last_beat = time.monotonic()
                yield ": heartbeat\n\n"
    finally:
        cancel()
