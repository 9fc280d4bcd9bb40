"""Which tenants have spend envelopes, as this process last read it (every ``ttl`` s): a run
of a tenant without any reserves only against its own cap, and asks the database nothing
(``shared.engine.spend``). Held by the runtime."""

from __future__ import annotations

import threading
import time

from sqlalchemy.engine import Engine

from shared.store import spend as store
from shared.store.db import reading

__all__ = ["Envelopes"]


class Envelopes:
    def __init__(self, ttl: float = 5.0) -> None:
        self.ttl = ttl
        self._tenants: set[str] = set()
        self._read = float("-inf")
        self._lock = threading.Lock()

    def any(self, engine: Engine, tenant: str) -> bool:
        """Whether ``tenant`` has an envelope (known at most ``ttl`` s late)."""
        with self._lock:
            if time.monotonic() - self._read > self.ttl:
                with reading(engine) as conn:
                    self._tenants = store.envelope_tenants(conn)
                self._read = time.monotonic()
            return tenant in self._tenants

    def changed(self) -> None:
        """An envelope was created or deleted by this process: read again at the next call."""
        with self._lock:
            self._read = float("-inf")
