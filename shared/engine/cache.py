"""Per-process caches that make a round cheaper without holding run state: every entry is
checked against what the database says (a run's spec never changes; messages are append-only),
so a miss, an eviction or another worker's progress only costs a full read.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from sqlalchemy.engine import Connection

from shared.agent.messages import Message
from shared.agent.spec import AgentSpec
from shared.store import repo

__all__ = ["history", "spec_of"]

K = TypeVar("K")
V = TypeVar("V")


class _LRU(Generic[K, V]):
    def __init__(self, size: int) -> None:
        self._data: OrderedDict[K, V] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self._size:
                self._data.popitem(last=False)

    def get_or(self, key: K, make: Callable[[], V]) -> V:
        value = self.get(key)
        if value is None:
            value = make()
            self.put(key, value)
        return value


_specs: _LRU[str, AgentSpec] = _LRU(256)  # a worker is busy with a few hundred runs at most
_history: _LRU[str, tuple[int, int, tuple[Message, ...]]] = _LRU(256)


def spec_of(run: Any) -> AgentSpec:
    """The run's parsed spec (immutable for the life of a run)."""
    return _specs.get_or(str(run["id"]), lambda: AgentSpec.model_validate(run["agent"]))


def history(conn: Connection, run_id: str, view_start: int, msg_seq: int) -> list[Message]:
    """The model view's messages (``seq >= view_start``), reading only rows this process has
    not seen: messages are append-only, so a cached prefix stays true."""
    cached = _history.get(run_id)
    if cached is not None and cached[0] == view_start and cached[1] <= msg_seq:
        start, seen, msgs = cached
        new = repo.list_messages(conn, run_id, seen + 1) if seen < msg_seq else []
    else:
        seen, msgs = view_start - 1, ()
        new = repo.list_messages(conn, run_id, view_start)
    out = msgs + tuple(repo.message_from_row(r) for r in new)
    last = new[-1]["seq"] if new else seen
    _history.put(run_id, (view_start, last, out))
    return list(out)
