"""What a process does at most every so often (the reaper's purge of ended runs, say): the
last time each thing was done, held by the runtime (``Runtime.pacer``)."""

from __future__ import annotations

import threading

__all__ = ["Pacer"]


class Pacer:
    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()

    def due(self, what: str, every: float, ts: float) -> bool:
        """Whether ``what`` was last done ``every`` seconds or more before ``ts`` (it counts
        as done at ``ts`` when it is)."""
        with self._lock:
            if ts - self._last.get(what, float("-inf")) < every:
                return False
            self._last[what] = ts
            return True
