"""Leases by heartbeat. A worker process registers itself once (``workers`` row) and one
thread refreshes its ``seen_at`` every third of the lease length. Claiming a round or a tool
call writes the process's id into the row's ``lease_owner``; the lease is live while that
process's heartbeat is fresh. So a process holding 500 rounds costs one UPDATE per tick, not
500, and a killed process loses all its leases at once, ``lease_seconds`` after its last beat.

A live process also gives back, each tick, the leases it holds but no thread of it works on
(a round whose commit failed on a held lock, a tool task that raised): a lease is the
process's, so without this sweep such work would wait for the process to die. A thread
registers its work (``working``) before it claims, so the sweep never frees a claim in
flight.

``fresh`` says whether this process's own heartbeat is current: a process that was paused
or cut off longer than a lease may have lost its leases to another, and must not start an
effect before it has beaten again and checked its claim.

The same tick is the backstop for stopping work: it asks the database whether the runs this
process is working on were cancelled (or moved on), and aborts their model calls and tools.
The fast path is the live bus (``shared.engine.stopper``).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine

from shared.store import runs as run_store
from shared.store import workers as store
from shared.store.db import reading

__all__ = ["Heartbeat", "heartbeat_for"]

log = logging.getLogger("treadle.leases")


class Heartbeat:
    """This process's worker identity and its heartbeat on one database."""

    def __init__(self, engine: Engine, lease: float) -> None:
        self._engine = weakref.ref(engine)
        self.lease = lease
        self.id = f"{socket.gethostname()[:40]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._lock = threading.Lock()
        self._registered = False
        self._thread: threading.Thread | None = None
        self.ticks: list[Callable[[], None]] = []  # extra work per tick (the stop backstop)
        self._failing = False
        self._stop = threading.Event()
        self._beaten = time.monotonic()  # the last successful beat (registering counts)
        self._work: Counter[str] = Counter()  # what this process's threads work on
        # per "queue/priority": the send time of the newest dispatch this process took
        self._received: dict[str, float] = {}
        # by run: usage rows of a round that could neither commit nor give its lease back
        self._owed: dict[str, list[dict[str, Any]]] = {}

    def owner(self) -> str:
        """The lease owner id to claim with; registers and starts beating on first use."""
        if not self._registered:
            with self._lock:
                if not self._registered:
                    self._register()
        return self.id

    @contextmanager
    def working(self, key: str) -> Iterator[None]:
        """A thread works on ``key`` (a run id, or ``run_id:call_id``): its lease is not
        swept while the block runs. Enter it before claiming."""
        with self._lock:
            self._work[key] += 1
        try:
            yield
        finally:
            with self._lock:
                self._work[key] -= 1
                if self._work[key] <= 0:
                    del self._work[key]

    def received(self, queue: str, priority: int, sent: float) -> None:
        """This process took a dispatch sent at ``sent`` from ``queue`` at ``priority``: an
        older one of that queue and priority not claimed by now was lost (queues are FIFO
        per priority); written with the next beat, read by the reaper."""
        key = f"{queue}/{priority}"
        with self._lock:
            if sent > self._received.get(key, 0.0):
                self._received[key] = sent

    def fresh(self) -> bool:
        """This process beat within the last two thirds of a lease (its leases hold)."""
        return time.monotonic() - self._beaten < self.lease * 2 / 3

    def live_after(self, ts: float) -> float:
        """A lease is live if its owner was seen at or after this time."""
        return ts - self.lease

    def _register(self) -> None:
        engine = self._engine()
        if engine is None:
            raise RuntimeError("the database engine is gone")
        with engine.begin() as conn:
            store.register(conn, self.id, socket.gethostname()[:255], os.getpid(), run_store.now())
        self._beaten = time.monotonic()
        self._registered = True
        self._thread = threading.Thread(target=self._loop, daemon=True, name="treadle-heartbeat")
        self._thread.start()

    def stop(self) -> None:
        """The engine was disposed of: stop beating (its leases lapse)."""
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.lease / 3):
            engine = self._engine()
            if engine is None:
                return  # the engine was disposed of and collected: nothing holds leases
            if self.beat(engine):
                self.sweep(engine)
            for tick in list(self.ticks):
                try:
                    tick()
                except Exception:
                    log.warning("heartbeat tick failed", exc_info=True)

    def beat(self, engine: Engine) -> bool:
        """Refresh this process's ``seen_at``; False when the database could not be reached."""
        try:
            with self._lock:
                received = dict(self._received) or None
            with engine.begin() as conn:
                if not store.beat(conn, self.id, run_store.now(), received):
                    host = socket.gethostname()[:255]
                    store.register(conn, self.id, host, os.getpid(), run_store.now())
        except Exception as exc:  # retried at the next tick; the lease is three ticks long
            if not self._failing:  # once per outage, not every tick
                log.warning("heartbeat failed (retrying every %.1fs): %s", self.lease / 3, exc)
            self._failing = True
            return False
        self._beaten = time.monotonic()
        if self._failing:
            log.warning("heartbeat restored")
        self._failing = False
        return True

    def owe(self, run_id: str, rows: list[dict[str, Any]]) -> None:
        """A round of ``run_id`` made these model calls and could neither commit nor give its
        lease back (the database was out of reach): the sweep that gives the lease back
        writes them (L-12). Should this process die first, the round's takeover bills the
        abandoned call instead (estimated)."""
        if rows:
            with self._lock:
                self._owed.setdefault(run_id, []).extend(rows)

    def sweep(self, engine: Engine) -> int:
        """Give back the leases this process holds that none of its threads works on (with
        the usage rows owed for them)."""
        try:
            with reading(engine) as conn:  # a read: no write lock (SQLite), no ROLLBACK (PG)
                rounds, calls = store.held(conn, self.id)
            with self._lock:  # after reading: a claim made since is not among them
                busy = set(self._work)
            rounds = [r for r in rounds if r[0] not in busy]
            calls = [c for c in calls if f"{c[0]}:{c[1]}" not in busy]
            if not rounds and not calls:
                return 0
            with self._lock:
                owed = {r[0]: list(self._owed[r[0]]) for r in rounds if r[0] in self._owed}
            with engine.begin() as conn:  # each guarded by its version or attempt
                n = store.give_back(conn, self.id, rounds, calls, run_store.now(), owed)
            with self._lock:
                for run_id in owed:
                    self._owed.pop(run_id, None)
        except Exception as exc:
            log.warning("lease sweep failed: %s", exc)
            return 0
        if n:
            log.info("gave back %d leases no thread works on", n)
        return n


_heartbeats: weakref.WeakKeyDictionary[Engine, Heartbeat] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def heartbeat_for(engine: Engine, lease: float) -> Heartbeat:
    """The process's heartbeat on this database."""
    with _lock:
        hb = _heartbeats.get(engine)
        if hb is None:
            hb = _heartbeats[engine] = Heartbeat(engine, lease)
            event.listen(engine, "engine_disposed", lambda _e: _forget(engine))
        return hb


def _forget(engine: Engine) -> None:
    with _lock:
        hb = _heartbeats.pop(engine, None)
    if hb is not None:
        hb.stop()
