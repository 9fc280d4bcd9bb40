"""Stopping work in flight when its run ends elsewhere (a cancel, a parent's cancel).

A round's model call and a tool call each run with an ``Abort`` handle
(``shared.llm.abort``); while they do, the handle is registered with the process's
``Stopper`` (``Runtime.stopper``) under the run's id. A transition that cancels runs names
them in ``Tx.stopped``; after its commit it publishes one message on the live bus's stop
topic, which every process listens to (Redis pub/sub across hosts, in-process in embedded
mode), and the process holding a handle of that run cancels it: the HTTP stream is closed,
the subprocess killed, within the watchdog's interval.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from shared.engine.livebus import LiveBus
from shared.llm.abort import Abort

__all__ = ["STOP_TOPIC", "Stopper", "stop_message"]

log = logging.getLogger("treadle.stopper")
STOP_TOPIC = "_stop"
"""The live bus channel (a pseudo run id) every process listens to for stops."""


def stop_message(run_ids: list[str]) -> dict[str, Any]:
    return {"type": "stop", "run_ids": run_ids}


class Stopper:
    """The work in flight of this process, by run, and the stop topic it listens to."""

    def __init__(self) -> None:
        self._held: dict[str, set[Abort]] = defaultdict(set)
        self._lock = threading.Lock()
        self._listening: set[int] = set()

    @contextmanager
    def holding(self, run_id: str, abort: Abort, bus: LiveBus) -> Iterator[Abort]:
        """Register ``abort`` as work in flight for ``run_id`` while the block runs (the
        stop topic of ``bus`` listened to from then on)."""
        self.listen(bus)
        with self._lock:
            self._held[run_id].add(abort)
        try:
            yield abort
        finally:
            with self._lock:
                aborts = self._held.get(run_id)
                if aborts is not None:
                    aborts.discard(abort)
                    if not aborts:
                        del self._held[run_id]

    def stop(self, run_id: str, reason: str = "the run was cancelled") -> int:
        """Cancel every handle this process holds for ``run_id``; returns how many."""
        with self._lock:
            aborts = list(self._held.get(run_id, ()))
        for abort in aborts:
            abort.cancel(reason)
        return len(aborts)

    def listen(self, bus: LiveBus) -> None:
        """Listen to the stop topic of this bus (once per bus)."""
        with self._lock:
            if id(bus) in self._listening:
                return
            self._listening.add(id(bus))

        def on_message(message: dict[str, Any]) -> None:
            for run_id in message.get("run_ids") or ():
                if self.stop(str(run_id)):
                    log.info("stopped the work in flight of run %s", run_id)

        bus.subscribe(STOP_TOPIC, on_message)
