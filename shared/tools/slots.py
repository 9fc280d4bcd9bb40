"""A fixed number of slots shared fairly by tenants: a worker runs at most that many sandboxes
and PDF readers at once, and when they are all taken the waiting calls are served tenant by
tenant in turn (oldest first within a tenant), so one tenant's burst of calls waits behind
itself, not in front of everyone else's.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterator

from shared.errors import ToolError
from shared.llm.abort import Abort

__all__ = ["FairSlots"]

_POLL_S = 0.25  # a waiter looks at its abort handle at least this often


class FairSlots:
    """``with slots.slot(tenant, timeout, abort):`` holds one of ``capacity`` slots (0: no
    limit). Waits in line, round robin over tenants; ToolError when ``timeout`` passes first,
    the abort's error when it fires."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._free = capacity
        self._lines: OrderedDict[str, deque[object]] = OrderedDict()
        self._cond = threading.Condition()

    @property
    def in_use(self) -> int:
        return self.capacity - self._free

    def waiting(self) -> int:
        with self._cond:
            return sum(len(line) for line in self._lines.values())

    @contextlib.contextmanager
    def slot(
        self, tenant: str, timeout: float | None = None, abort: Abort | None = None
    ) -> Iterator[None]:
        if self.capacity <= 0:
            yield
            return
        self._take(tenant, timeout, abort)
        try:
            yield
        finally:
            with self._cond:
                self._free += 1
                self._cond.notify_all()

    def _take(self, tenant: str, timeout: float | None, abort: Abort | None) -> None:
        ticket = object()
        until = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._lines.setdefault(tenant, deque()).append(ticket)
            try:
                while not (self._free > 0 and self._next() is ticket):
                    left = None if until is None else until - time.monotonic()
                    if left is not None and left <= 0:
                        raise ToolError(
                            f"no sandbox slot came free within {timeout:g}s "
                            f"(all {self.capacity} of this worker are busy)"
                        )
                    if abort is not None:
                        abort.check()
                    self._cond.wait(_POLL_S if left is None else min(left, _POLL_S))
            except BaseException:
                self._leave(tenant, ticket)
                self._cond.notify_all()
                raise
            self._leave(tenant, ticket)
            self._free -= 1
            if tenant in self._lines:  # its next call goes behind the other tenants'
                self._lines.move_to_end(tenant)

    def _next(self) -> object | None:
        for line in self._lines.values():
            return line[0]
        return None

    def _leave(self, tenant: str, ticket: object) -> None:
        line = self._lines.get(tenant)
        if line is None:
            return
        with contextlib.suppress(ValueError):
            line.remove(ticket)
        if not line:
            del self._lines[tenant]
