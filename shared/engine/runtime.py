"""What the engine needs from the outside world, injected: database, publisher, live bus."""

from __future__ import annotations

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

__all__ = ["InProcessBus", "LiveBus", "OutboxItem", "Publisher", "Runtime", "worker_id"]

OutboxItem = tuple[int, str, dict[str, Any]]  # (outbox id, kind, payload)


class Publisher(Protocol):
    def __call__(self, items: list[OutboxItem]) -> None: ...


class LiveBus(Protocol):
    """Live, unstored events (model deltas) and wake-ups for SSE tails."""

    def publish(self, run_id: str, event: dict[str, Any]) -> None: ...

    def subscribe(self, run_id: str, callback: Callable[[dict[str, Any]], None]) -> Callable[[], None]: ...


class InProcessBus:
    """Embedded mode: callbacks in this process."""

    def __init__(self) -> None:
        self._subs: dict[str, list[Callable[[dict[str, Any]], None]]] = defaultdict(list)
        self._lock = threading.Lock()

    def publish(self, run_id: str, event: dict[str, Any]) -> None:
        with self._lock:
            subs = list(self._subs.get(run_id, ()))
        for cb in subs:
            cb(event)

    def subscribe(self, run_id: str, callback: Callable[[dict[str, Any]], None]) -> Callable[[], None]:
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
