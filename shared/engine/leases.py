"""One lease renewer per process: a single thread renews every lease this process holds (rounds
waiting on a model, tools running) every third of the lease length, in one transaction.

A thread and a connection per held lease would cost a connection each while it sleeps and,
with a few hundred threads fleet-wide, exhaust PostgreSQL's connection limit.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.engine import Engine

from shared.store import repo

__all__ = ["LeaseRenewer", "renewer_for"]

log = logging.getLogger("treadle.leases")

RoundKey = tuple[str, str, int, str]  # ("round", run_id, version, owner)
ToolKey = tuple[str, str, str, int]  # ("tool", run_id, call_id, attempt)


class LeaseRenewer:
    def __init__(self, engine: Engine, lease: float) -> None:
        self.engine, self.lease = engine, lease
        self._held: dict[tuple[object, ...], int] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    @contextmanager
    def hold(self, key: tuple[object, ...]) -> Iterator[None]:
        with self._lock:
            self._held[key] = self._held.get(key, 0) + 1
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, daemon=True, name="treadle-leases"
                )
                self._thread.start()
        try:
            yield
        finally:
            with self._lock:
                n = self._held.get(key, 0) - 1
                if n > 0:
                    self._held[key] = n
                else:
                    self._held.pop(key, None)

    def held(self) -> int:
        with self._lock:
            return len(self._held)

    def _loop(self) -> None:
        while not self._wake.wait(self.lease / 3):
            with self._lock:
                keys = list(self._held)
            if keys:
                self.renew(keys)

    def renew(self, keys: list[tuple[object, ...]]) -> None:
        until = repo.now() + self.lease
        try:
            with self.engine.begin() as conn:
                for key in keys:
                    if key[0] == "round":
                        _, run_id, version, owner = key
                        repo.renew_round(conn, str(run_id), int(version), str(owner), until)  # type: ignore[call-overload]
                    else:
                        _, run_id, call_id, attempt = key
                        repo.renew_tool(conn, str(run_id), str(call_id), int(attempt), until)  # type: ignore[call-overload]
        except Exception:  # retried at the next tick; the lease is a third longer than it
            log.warning("lease renewal failed for %d leases", len(keys), exc_info=True)


_renewers: dict[int, LeaseRenewer] = {}
_renewers_lock = threading.Lock()


def renewer_for(engine: Engine, lease: float) -> LeaseRenewer:
    """The process's renewer for this engine."""
    with _renewers_lock:
        r = _renewers.get(id(engine))
        if r is None or r.engine is not engine:
            r = _renewers[id(engine)] = LeaseRenewer(engine, lease)
        return r
