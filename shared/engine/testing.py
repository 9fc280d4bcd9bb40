"""A stub broker for fast engine tests (model: dramatiq's StubBroker): publishing appends to
a list; ``drain`` executes the messages with the real engine functions, in this process."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

from shared.engine.round import RetryRound, run_round
from shared.engine.runtime import OutboxItem, Runtime
from shared.engine.toolrun import run_tool
from shared.engine.webhooks import deliver

__all__ = ["StubBroker"]


@dataclass
class StubBroker:
    queue: deque[OutboxItem] = field(default_factory=deque)
    sent: list[OutboxItem] = field(default_factory=list)
    retries: list[float] = field(default_factory=list)
    attempts: dict[int, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, items: list[OutboxItem]) -> None:
        with self._lock:
            self.queue.extend(items)
            self.sent.extend(items)

    def pop(self) -> OutboxItem | None:
        with self._lock:
            return self.queue.popleft() if self.queue else None

    def deliver(self, rt: Runtime, item: OutboxItem) -> str:
        outbox_id, kind, payload = item
        attempt = self.attempts.get(outbox_id, 0)
        if kind == "tool":
            return run_tool(
                rt, payload["run_id"], payload["call_id"], payload["version"], outbox_id
            )
        if kind == "webhook":
            return deliver(rt, payload["delivery_id"], outbox_id)
        try:
            return run_round(rt, payload["run_id"], payload["version"], outbox_id, attempt).status
        except RetryRound as r:
            self.retries.append(r.delay)
            self.attempts[outbox_id] = attempt + 1 if r.counts else attempt
            with self._lock:
                self.queue.append(item)
            return "retry"

    def drain(self, rt: Runtime, limit: int = 10_000) -> int:
        """Deliver until the queue is empty; returns how many messages ran."""
        n = 0
        while n < limit:
            item = self.pop()
            if item is None:
                return n
            self.deliver(rt, item)
            n += 1
        raise RuntimeError("stub broker did not drain: a message loop?")
