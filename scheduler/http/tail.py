"""Follow a run: its durable events after a cursor, in batches, with the live deltas
interleaved, until an end event. The one tail every stream reads through: the native SSE
stream (``scheduler.http.sse``, ends at the terminal event) and both facades
(``scheduler.interop``, end at a segment's pause or terminal event) only translate its items.

No event is skipped or sent twice across reconnects: each durable event's seq is taken by an
UPDATE of the run's row, which holds the row lock until commit, so seqs become visible in
order, and the tail only ever reads ``seq > cursor``. The tail reads the table when a commit
wakes it (a ``wake`` message on the live bus: Redis pub/sub across API replicas, in-process
in embedded mode) and, as a fallback for a lost wake, every ``poll`` seconds. It subscribes to
the bus before its first read, so a commit between the two still wakes it.

A run resumed after it ended (``POST /v1/runs/{id}/resume``) has events after its terminal
one: a run's whole stream reads on past a terminal event that others follow.

A live delta of a round whose ``round.started`` this tail has not read yet makes it read the
table first, so a delta always comes after the durable events before it (facades number
deltas from the round's ``round.started``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from starlette.concurrency import run_in_threadpool

from shared.engine.livebus import WAKE
from shared.engine.runtime import Runtime
from shared.store import records
from shared.store.db import reading
from shared.vocab import SEGMENT_ENDS, EventType

__all__ = [
    "HEARTBEAT_S",
    "LIVE_TYPES",
    "POLL_S",
    "TERMINAL",
    "Batch",
    "Beat",
    "Delta",
    "TailItem",
    "follow",
    "tailing",
    "wait_for_end",
]

TERMINAL = frozenset({EventType.RUN_COMPLETED, EventType.RUN_FAILED, EventType.RUN_CANCELLED})
LIVE_TYPES = frozenset({EventType.TEXT_DELTA, EventType.REASONING_DELTA, EventType.TOOL_PROGRESS})
HEARTBEAT_S = 15.0
POLL_S = 1.0
BATCH = 500


@dataclass(frozen=True)
class Batch:
    """Durable events, in seq order; ``last`` is true when the batch holds the end event."""

    events: list[dict[str, Any]]
    last: bool = False


@dataclass(frozen=True)
class Delta:
    """A live, unstored event (model text or reasoning, a tool's progress) of the run."""

    type: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Beat:
    """Nothing happened for ``heartbeat`` seconds: a stream sends its keep-alive."""


TailItem = Batch | Delta | Beat


def _fetch(rt: Runtime, run_id: str, after: int) -> list[dict[str, Any]]:
    with reading(rt.engine) as conn:
        return [dict(r) for r in records.list_events(conn, run_id, after, limit=BATCH)]


class _Reader:
    """The durable side of one tail: what was read (``cursor``) and whether it ended."""

    def __init__(
        self, rt: Runtime, run_id: str, cursor: int, ends: frozenset[str], until: int | None
    ) -> None:
        self.rt, self.run_id, self.cursor = rt, run_id, cursor
        self.ends, self.until = ends, until
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

    def _resumed(self, rows: list[dict[str, Any]], i: int) -> bool:
        """A run's whole stream (ends: the terminal events) reads on past a terminal event
        that more events follow: the run was resumed after it ended."""
        return self.ends == TERMINAL and rows[i]["type"] in TERMINAL and i + 1 < len(rows)

    def _cut(
        self, rows: list[dict[str, Any]], upto_round: int | None
    ) -> tuple[list[dict[str, Any]], bool]:
        for i, ev in enumerate(rows):
            if self._resumed(rows, i):
                continue
            if ev["type"] in self.ends or (self.until is not None and ev["seq"] >= self.until):
                self.done = True
                return rows[: i + 1], False
            if ev["type"] == EventType.ROUND_STARTED:
                self.round = int((ev["data"] or {}).get("round") or 0)
                if upto_round is not None and self.round >= upto_round:
                    return rows[: i + 1], True
        return rows, False


def _put(q: asyncio.Queue[dict[str, Any]], event: dict[str, Any]) -> None:
    if not q.full():  # a client too slow for the deltas loses some; wakes are re-polled
        q.put_nowait(event)


async def _next(q: asyncio.Queue[dict[str, Any]], timeout: float) -> dict[str, Any] | None:
    try:
        return await asyncio.wait_for(q.get(), timeout=max(0.0, timeout))
    except TimeoutError:
        return None


@asynccontextmanager
async def tailing(
    rt: Runtime,
    run_id: str,
    cursor: int,
    *,
    ends: frozenset[str],
    until: int | None = None,
    heartbeat: float = HEARTBEAT_S,
    poll: float = POLL_S,
    live: bool = True,
) -> AsyncIterator[AsyncIterator[TailItem]]:
    """Subscribed to the run's live events on entry (a stream may say "connected" then);
    the items: durable events after ``cursor`` up to the first of ``ends`` (or ``until``),
    live deltas in between (unless ``live`` is false), a ``Beat`` every ``heartbeat``
    seconds. Unsubscribed on exit."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=10_000)

    def on_live(event: dict[str, Any]) -> None:  # on the publisher's (or listener's) thread
        loop.call_soon_threadsafe(_put, queue, event)

    cancel = rt.live.subscribe(run_id, on_live)
    try:
        reader = _Reader(rt, run_id, cursor, ends, until)
        yield _items(reader, queue, heartbeat, poll, live)
    finally:
        cancel()


async def _items(
    reader: _Reader,
    queue: asyncio.Queue[dict[str, Any]],
    heartbeat: float,
    poll: float,
    live: bool,
) -> AsyncIterator[TailItem]:
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


async def _handle(
    reader: _Reader, item: dict[str, Any] | None, live: bool
) -> AsyncIterator[TailItem]:
    if item is None:
        return
    kind = item.get("type")
    if kind == WAKE and (item.get("seq") is None or item["seq"] > reader.cursor):
        async for batch in reader.read():
            yield batch
    elif kind in LIVE_TYPES and live and not reader.done:
        data = dict(item.get("data") or {})
        round_ = int(data.get("round") or 0)
        if round_ > reader.round:  # its round.started (committed before the call) first
            async for batch in reader.read(upto_round=round_):
                yield batch
            reader.round = max(reader.round, round_)
        if not reader.done:
            yield Delta(str(kind), data)


async def follow(
    rt: Runtime,
    run_id: str,
    cursor: int,
    *,
    ends: frozenset[str] = SEGMENT_ENDS,
    until: int | None = None,
    heartbeat: float = HEARTBEAT_S,
    poll: float = POLL_S,
    live: bool = True,
) -> AsyncIterator[TailItem]:
    """``tailing`` as one iterator (subscribed at its first item). Facades follow a segment:
    ``ends`` defaults to its pause or terminal event."""
    async with tailing(
        rt, run_id, cursor, ends=ends, until=until, heartbeat=heartbeat, poll=poll, live=live
    ) as items:
        async for item in items:
            yield item


async def wait_for_end(
    rt: Runtime, run_id: str, from_seq: int, *, beat: float = 5.0
) -> AsyncIterator[dict[str, Any] | None]:
    """Yield None every ``beat`` seconds while the segment runs, then its end event."""
    async for item in follow(rt, run_id, from_seq, heartbeat=beat, live=False):
        if isinstance(item, Beat):
            yield None
        elif isinstance(item, Batch) and item.last:
            yield item.events[-1]
            return
