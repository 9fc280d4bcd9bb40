"""The tool lists of MCP servers a process has fetched: one ``ToolLists`` per process, held by
the runtime (``Runtime.mcp_lists``) and passed in; no module state.

Bounded like the engine's other caches: by bytes (an estimate of what the lists hold), across
every server identity, least recently used first out, so a tenant naming a new MCP URL on every
run costs the cache's limit at most, never memory that grows with the URLs seen.

A list is fresh for ``ttl``; a failed listing is remembered for a short while (a dead server is
not asked again every round); a list that cannot be refreshed serves stale (a day at most).

A cold listing runs on the process's event loop (``shared.tools.aioloop``), not in the caller's
thread; the caller waits for it at most ``wait`` seconds (the run's deadline and the operator's
``TREADLE_MCP_LIST_WAIT_S``) and goes on without the server's tools when it is not there yet:
the listing ends in the background under its own wall limit and the next round finds it. At
most ``tenant_waiters`` threads of one tenant wait at once in a process: a lookup past that
does not wait, its listing is ``deferred`` (the engine gives the round back and tries again a
moment later, holding no thread meanwhile); and at most ``max_pending`` listings are in
flight. A slow or hostile server costs its own runs' rounds, not the threads other tenants'
runs need.
"""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = ["Fetched", "Job", "Listing", "RemoteTool", "ToolLists"]

FAILURE_TTL = 15.0  # a failed listing is not retried sooner than this (nor later than ttl)
STALE_FOR = 24 * 3600.0  # a list that could not be refreshed serves this long
_ENTRY_OVERHEAD = 512
_OBJECT_FACTOR = 4  # Python objects of parsed JSON take about this many times its text


@dataclass(frozen=True, slots=True)
class RemoteTool:
    """One tool as the server lists it."""

    name: str
    description: str
    parameters: dict[str, Any]
    read_only_hint: bool = False

    @property
    def size(self) -> int:
        """Bytes of its text (name, description, schema as JSON)."""
        return len(self.name) + len(self.description) + len(json.dumps(self.parameters))


@dataclass(frozen=True, slots=True)
class Fetched:
    """What one listing got: the tools kept, and what was left out of them (``note``)."""

    tools: tuple[RemoteTool, ...]
    note: str = ""


@dataclass(frozen=True, slots=True)
class Listing:
    """What a lookup found for one server: its tools, or why not (``tools`` None)."""

    tools: tuple[RemoteTool, ...] | None
    error: str = ""
    stale: bool = False  # the last list, served while a refresh fails
    note: str = ""  # what the listing left out
    deferred: bool = False  # still listing, and this lookup did not wait: ask again shortly


@dataclass(frozen=True, slots=True)
class Job:
    """One server to look up: its identity, how to start its listing (a future of its tools,
    failing with a readable message), and how long a list stays fresh."""

    key: Hashable
    start: Callable[[], concurrent.futures.Future[Fetched]]
    ttl: float


@dataclass(slots=True)
class _Entry:
    tools: tuple[RemoteTool, ...] | None
    fetched_at: float
    fresh_until: float
    error: str = ""
    size: int = _ENTRY_OVERHEAD
    note: str = ""


@dataclass
class _Pending:
    future: concurrent.futures.Future[Fetched]
    ttl: float
    known: _Entry | None


@dataclass
class ToolLists:
    """Tool lists by server identity, bounded by ``limit_bytes`` (see the module doc)."""

    limit_bytes: int = 16 * 1024 * 1024
    tenant_waiters: int = 2
    max_pending: int = 64
    _entries: OrderedDict[Hashable, _Entry] = field(default_factory=OrderedDict, init=False)
    _pending: dict[Hashable, _Pending] = field(default_factory=dict, init=False)
    _waiting: dict[str, int] = field(default_factory=dict, init=False)
    _bytes: int = field(default=0, init=False)
    # re-entrant: a future that is already done runs its callback (``_settle``) at once
    _lock: threading.RLock = field(default_factory=threading.RLock, init=False)

    @property
    def bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def find(self, jobs: Sequence[Job], tenant: str, wait: float) -> list[Listing]:
        """Each job's listing: cached, else fetched (waiting at most ``wait`` seconds for
        all of them together)."""
        now = time.monotonic()
        found: dict[int, Listing] = {}
        waits: dict[int, _Pending] = {}
        with self._lock:
            for i, job in enumerate(jobs):
                known = self._get(job.key)
                if known is not None and now < known.fresh_until:
                    found[i] = _listing(known)
                elif (pending := self._start(job, known)) is not None:
                    waits[i] = pending
                else:
                    found[i] = _stale_or(known, "too many MCP listings in flight; try later")
        if waits:
            waited = self._wait([p.future for p in waits.values()], tenant, wait)
            for i, pending in waits.items():
                found[i] = self._outcome(jobs[i].key, pending, wait, waited)
        return [found[i] for i in range(len(jobs))]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    # --- inside ---------------------------------------------------------------------------

    def _get(self, key: Hashable) -> _Entry | None:  # the lock held
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def _start(self, job: Job, known: _Entry | None) -> _Pending | None:  # the lock held
        pending = self._pending.get(job.key)
        if pending is not None:
            return pending
        if len(self._pending) >= self.max_pending:
            return None
        pending = _Pending(job.start(), job.ttl, known)
        self._pending[job.key] = pending
        pending.future.add_done_callback(lambda _f: self._settle(job.key, pending))
        return pending

    def _wait(
        self, futures: list[concurrent.futures.Future[Fetched]], tenant: str, wait: float
    ) -> bool:
        """Wait for ``futures`` unless this tenant already has its waiters (then False)."""
        with self._lock:
            if wait <= 0:
                return True
            if self._waiting.get(tenant, 0) >= self.tenant_waiters:
                return False
            self._waiting[tenant] = self._waiting.get(tenant, 0) + 1
        try:
            concurrent.futures.wait(futures, timeout=wait)
        finally:
            with self._lock:
                left = self._waiting[tenant] - 1
                if left:
                    self._waiting[tenant] = left
                else:
                    del self._waiting[tenant]
        return True

    def _outcome(self, key: Hashable, pending: _Pending, wait: float, waited: bool) -> Listing:
        if not pending.future.done():
            if not waited:
                found = _stale_or(pending.known, "still listing its tools (not waited for)")
                return found if found.tools is not None else replace(found, deferred=True)
            why = f"did not list its tools within {max(wait, 0):.3g}s (still trying)"
            return _stale_or(pending.known, why)
        self._settle(key, pending)
        with self._lock:
            entry = self._entries.get(key)
        return _listing(entry) if entry is not None else Listing(None, "evicted; try later")

    def _settle(self, key: Hashable, pending: _Pending) -> None:
        """Store what a finished listing got (once: from its callback or its waiter)."""
        with self._lock:
            if self._pending.get(key) is not pending:
                return
            del self._pending[key]
            self._put(key, _entry_of(pending, time.monotonic()))

    def _put(self, key: Hashable, entry: _Entry) -> None:  # the lock held
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= old.size
        if entry.size > self.limit_bytes:
            return
        self._entries[key] = entry
        self._bytes += entry.size
        while self._bytes > self.limit_bytes:
            _, dropped = self._entries.popitem(last=False)
            self._bytes -= dropped.size


def _entry_of(pending: _Pending, now: float) -> _Entry:
    future, known, ttl = pending.future, pending.known, pending.ttl
    error = future.exception()
    if error is None:
        got = future.result()
        size = _ENTRY_OVERHEAD + _OBJECT_FACTOR * sum(t.size for t in got.tools)
        return _Entry(got.tools, now, now + ttl, size=size, note=got.note)
    retry_at = now + min(ttl, FAILURE_TTL)
    if known is not None and known.tools is not None and now - known.fetched_at < STALE_FOR:
        return _Entry(known.tools, known.fetched_at, retry_at, str(error), known.size, known.note)
    return _Entry(None, now, retry_at, str(error) or type(error).__name__)


def _listing(entry: _Entry) -> Listing:
    if entry.tools is None:
        return Listing(None, entry.error)
    return Listing(entry.tools, entry.error, stale=bool(entry.error), note=entry.note)


def _stale_or(known: _Entry | None, why: str) -> Listing:
    if known is not None and known.tools is not None:
        return Listing(known.tools, why, stale=True, note=known.note)
    return Listing(None, why)
