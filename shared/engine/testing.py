"""A stub broker for fast engine tests (model: dramatiq's StubBroker): publishing appends to
a list; ``drain`` executes the dispatches with the real engine functions, in this process.
A dispatch with a countdown runs when its turn comes (the stub does not wait)."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

from shared.engine.round import run_round
from shared.engine.runtime import Dispatch, Runtime
from shared.engine.toolrun import run_tool
from shared.engine.webhooks import deliver
from shared.store import runs as run_store

__all__ = ["StubBroker"]


@dataclass
class StubBroker:
    queue: deque[Dispatch] = field(default_factory=deque)
    sent: list[Dispatch] = field(default_factory=list)
    retries: list[float] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, items: list[Dispatch]) -> None:
        with self._lock:
            self.queue.extend(items)
            self.sent.extend(items)
            self.retries += [d.countdown for d in items if d.countdown is not None]

    def pop(self) -> Dispatch | None:
        with self._lock:
            return self.queue.popleft() if self.queue else None

    def deliver(self, rt: Runtime, d: Dispatch) -> str:
        if d.kind == "tool":
            assert d.call_id is not None
            return run_tool(rt, d.run_id, d.call_id, d.version)
        if d.kind == "webhook":
            assert d.delivery_id is not None
            return deliver(rt, d.delivery_id, d.outbox_id)
        if d.countdown:
            _wait_until_due(rt, d)
        return run_round(rt, d.run_id, d.version, d.attempt).status

    def drain(self, rt: Runtime, limit: int = 10_000) -> int:
        """Deliver until the queue is empty; returns how many dispatches ran."""
        n = 0
        while n < limit:
            item = self.pop()
            if item is None:
                return n
            self.deliver(rt, item)
            n += 1
        raise RuntimeError("stub broker did not drain: a message loop?")


def _wait_until_due(rt: Runtime, d: Dispatch) -> None:
    """A retried round is due at its ``wake_at``: the stub makes it due now instead of
    sleeping (tests check the delay in ``retries``)."""
    with rt.engine.begin() as conn:
        run_store.make_due(conn, d.run_id, d.version)
