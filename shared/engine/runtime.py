"""What the engine needs from the outside world, injected: database, publisher, live bus."""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from sqlalchemy.engine import Engine

from shared.agent.spec import ModelProfile
from shared.config import Settings
from shared.llm.ratelimit import LocalLimiter, RateLimiter

__all__ = ["WAKE", "InProcessBus", "LiveBus", "OutboxItem", "Publisher", "Runtime", "worker_id"]

log = logging.getLogger("treadle.live")
WAKE = "wake"  # a live message: durable events up to ``seq`` were committed (SSE tails fetch)
OutboxItem = tuple[int, str, dict[str, Any]]  # (outbox id, kind, payload)


class Publisher(Protocol):
    def __call__(self, items: list[OutboxItem]) -> None: ...


class LiveBus(Protocol):
    """Live, unstored events (model deltas) and wake-ups for SSE tails."""

    def publish(self, run_id: str, event: dict[str, Any]) -> None: ...

    def subscribe(
        self, run_id: str, callback: Callable[[dict[str, Any]], None]
    ) -> Callable[[], None]: ...


class InProcessBus:
    """Embedded mode: callbacks in this process."""

    def __init__(self) -> None:
        self._subs: dict[str, list[Callable[[dict[str, Any]], None]]] = defaultdict(list)
        self._lock = threading.Lock()

    def publish(self, run_id: str, event: dict[str, Any]) -> None:
        with self._lock:
            subs = list(self._subs.get(run_id, ()))
        for cb in subs:
            try:
                cb(event)
            except Exception:  # a broken subscriber never breaks the publisher (a round)
                log.warning("live subscriber failed for %s", run_id, exc_info=True)

    def subscribe(
        self, run_id: str, callback: Callable[[dict[str, Any]], None]
    ) -> Callable[[], None]:
        with self._lock:
            self._subs[run_id].append(callback)

        def cancel() -> None:
            with self._lock:
                if callback in self._subs.get(run_id, []):
                    self._subs[run_id].remove(callback)
                    if not self._subs[run_id]:
                        del self._subs[run_id]

        return cancel


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident() % 100000}"


@dataclass
class Runtime:
    engine: Engine
    settings: Settings
    publish: Publisher
    live: LiveBus = field(default_factory=InProcessBus)
    profiles: dict[str, ModelProfile] = field(default_factory=dict)
    limiter: RateLimiter = field(default_factory=LocalLimiter)

    def wake(self, run_id: str, seq: int | None = None) -> None:
        """After a commit that wrote durable events (up to ``seq``; None = unknown): wake the
        run's SSE tails so they read them at once instead of at their next poll."""
        try:
            self.live.publish(run_id, {"type": WAKE, "seq": seq})
        except Exception:
            log.warning("wake failed for %s", run_id, exc_info=True)
