"""The engine gate: at most ``slots`` threads of a worker process run engine code at once.

A thread-pool worker holds a thread per run in a model call (a long I/O wait), so hundreds of
threads can become runnable in the same second: runs started together, a provider that
answers a batch at once, the end of an outage. Let in all at once, they share the GIL round
robin: every round of the burst moves a little, all of them end together at the end of the
burst, and their next model calls go out together again — the fleet never leaves the wave,
and the threads' switching costs CPU of its own. The gate lets a few threads in at a time and
picks who goes next: the later stage of a round first (a round's claim, then a tool's work,
then a model reply's commit), first come, first served within a stage. Rounds then end one
after another, their next model calls go out spread over time, and the replies come back
spread out.

Waits that are not engine work — the model call, a tool's execution, an MCP listing, a
dataset search's embedding — are taken outside the gate (``outside``), holding no database
connection (a thread waiting to come back in never holds one: the gate's holders may need
it). ``inside`` is re-entrant within a thread; ``outside`` in a thread not inside is a no-op,
so the API and embedded mode, which never enter, are not gated. ``slots=0``: no gate.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from enum import IntEnum

from shared.engine import metrics

__all__ = ["Gate", "Stage"]


class Stage(IntEnum):
    """What a thread comes in to do; a higher stage goes first."""

    REPLY = 0  # commit a model reply (the start of a round's engine work)
    TOOL = 1  # claim, run and commit a tool call
    CLAIM = 2  # claim a round and build its model request (the end of a round's work)


class Gate:
    """A counting gate with an ordered waiting line (stage first, then arrival)."""

    def __init__(self, slots: int) -> None:
        self.slots = max(0, slots)
        self._free = self.slots
        self._lock = threading.Lock()
        self._line: list[tuple[int, int, threading.Lock]] = []
        self._order = itertools.count()
        self._held = threading.local()

    def _depth(self) -> int:
        return int(getattr(self._held, "depth", 0))

    @contextmanager
    def inside(self, stage: Stage) -> Iterator[None]:
        """Run the block holding a slot (taken in the line's order)."""
        depth = self._depth()
        if not self.slots or depth:
            self._held.depth = depth + 1 if self.slots else 0
            try:
                yield
            finally:
                self._held.depth = depth
            return
        self._enter(stage)
        self._held.depth = 1
        try:
            yield
        finally:
            self._held.depth = 0
            self._leave()

    @contextmanager
    def outside(self, then: Stage) -> Iterator[None]:
        """Run the block without the slot; come back in at stage ``then``."""
        depth = self._depth()
        if not depth:
            yield
            return
        self._held.depth = 0
        self._leave()
        try:
            yield
        finally:
            self._enter(then)
            self._held.depth = depth

    def waiting(self) -> int:
        """Threads in line."""
        with self._lock:
            return len(self._line)

    def free(self) -> int:
        """Slots nobody holds."""
        with self._lock:
            return self._free

    def _enter(self, stage: Stage) -> None:
        with self._lock:
            if self._free and not self._line:
                self._free -= 1
                return
            turn = threading.Lock()
            turn.acquire()
            heapq.heappush(self._line, (-int(stage), next(self._order), turn))
        since = time.monotonic()
        turn.acquire()  # released by the holder that hands its slot over
        metrics.GATE_WAIT.labels(stage=stage.name.lower()).observe(time.monotonic() - since)

    def _leave(self) -> None:
        with self._lock:
            if self._line:
                heapq.heappop(self._line)[2].release()  # the slot passes to the next in line
            else:
                self._free += 1
