"""Follow a segment of a run (issue #16): its durable events after a cursor, in batches, with
the live deltas interleaved, until the segment's end event. The same wake-or-poll loop as
``scheduler.sse``, yielding raw items for a facade to translate.

A live delta of a round whose ``round.started`` this tail has not read yet makes it read the
table first, so a delta always comes after the durable events before it (facades number
deltas from the round's ``round.started``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.concurrency import run_in_threadpool

from scheduler.interop.segments import END_TYPES
from shared.engine.runtime import WAKE, Runtime
from shared.store import repo

__all__ = ["Batch", "Beat", "Delta", "TailItem", "follow", "wait_for_end"]

BATCH = 500
LIVE = frozenset({"text.delta", "reasoning.delta"})


@dataclass(frozen=True)
class Batch:
    """Durable events, in seq order; ``last`` is true when the batch holds the end event."""

    events: list[dict[str, Any]]
    last: bool = False


@dataclass(frozen=True)
class Delta:
    type: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Beat:
    pass


TailItem = Batch | Delta | Beat


def _fetch(rt: Runtime, run_id: str, after: int) -> list[dict[str, Any]]:
    with rt.engine.connect() as conn:
        return [dict(r) for r in repo.list_events(conn, run_id, after, limit=BATCH)]


class _Reader:
    def __init__(self, rt: Runtime, run_id: str, cursor: int, until: int | None) -> None:
        self.rt, self.run_id, self.cursor, self.until = rt, run_id, cursor, until
        self.done = False
        self.round = 0
        self.last_read = time.monotonic()

    async def read(self, upto_round: int | None = None) -> AsyncIterator[Batch]:
        """Committed events after the cursor; with ``upto_round``, only up to that round's
        ``round.started`` (a live delta of the round goes right after it)."""
        self.last_read = time.monotonic()
        while not self.done:
            rows = await run_in_threadpool(_fetch, self.rt, self.run_id, self.cursor)
            kept, paused = self._cut(rows, upto_round)
            if kept:
                self.cursor = kept[-1]["seq"]
                yield Batch(kept, last=self.done)
            if paused or len(rows) < BATCH:
                return

    def _cut(self, rows: list[dict[str, Any]], upto_round: int | None
             ) -> tuple[list[dict[str, Any]], bool]:
        for i, ev in enumerate(rows):
            if ev["type"] in END_TYPES or (self.until is not None and ev["seq"] >= self.until):
                self.done = True
                return rows[: i + 1], False
            if ev["type"] == "round.started":
                self.round = int((ev["data"] or {}).get("round") or 0)
                if upto_round is not None and self.round >= upto_round:
                    return rows[: i + 1], True
        return rows, False


def _put(q: asyncio.Queue[dict[str, Any]], event: dict[str, Any]) -> None:
    if not q.full():
        q.put_nowait(event)


async def _next(q: asyncio.Queue[dict[str, Any]], timeout: float) -> dict[str, Any] | None:
    try:
        return await asyncio.wait_for(q.get(), timeout=max(0.0, timeout))
    except TimeoutError:
        return None


async def follow(
    rt: Runtime, run_id: str, cursor: int, *, until: int | None = None, heartbeat: float = 15.0,
    poll: float = 1.0, live: bool = True,
) -> AsyncIterator[TailItem]:
    """Durable events after ``cursor`` up to the segment's end (or ``until``), live deltas in
    between, a ``Beat`` every ``heartbeat`` seconds. Ends after the end event."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=10_000)

    def on_live(event: dict[str, Any]) -> None:  # on the publisher's (or listener's) thread
        loop.call_soon_threadsafe(_put, queue, event)

    cancel: Callable[[], None] = rt.live.subscribe(run_id, on_live)
    reader = _Reader(rt, run_id, cursor, until)
    try:
        async for batch in reader.read():
            yield batch
        last_beat = time.monotonic()
        while not reader.done:
            wait = min(last_beat + heartbeat, reader.last_read + poll) - time.monotonic()
            item = await _next(queue, wait)
            async for out in _handle(reader, item, live):
                yield out
            if time.monotonic() - reader.last_read >= poll:
                async for batch in reader.read():
                    yield batch
            if time.monotonic() - last_beat >= heartbeat:
                last_beat = time.monotonic()
                yield Beat()
    finally:
        cancel()


async def _handle(
    reader: _Reader, item: dict[str, Any] | None, live: bool
) -> AsyncIterator[TailItem]:
    if item is None:
        return
    kind = item.get("type")
    if kind == WAKE and (item.get("seq") is None or item["seq"] > reader.cursor):
        async for batch in reader.read():
            yield batch
    elif kind in LIVE and live and not reader.done:
        data = dict(item.get("data") or {})
        round_ = int(data.get("round") or 0)
        if round_ > reader.round:  # its round.started (committed before the call) first
            async for batch in reader.read(upto_round=round_):
                yield batch
            reader.round = max(reader.round, round_)
        if not reader.done:
            yield Delta(str(kind), data)


async def wait_for_end(rt: Runtime, run_id: str, from_seq: int, *, beat: float = 5.0
                       ) -> AsyncIterator[dict[str, Any] | None]:
    """Yield None every ``beat`` seconds while the segment runs, then its end event."""
    async for item in follow(rt, run_id, from_seq, heartbeat=beat, live=False):
        if isinstance(item, Beat):
            yield None
        elif isinstance(item, Batch) and item.last:
            yield item.events[-1]
            return
