"""Stopping work in flight when its run ends elsewhere (a cancel, a parent's cancel).

A round's model call and a tool call each run with an ``Abort`` handle
(``shared.llm.abort``); while they do, the handle is registered here under the run's id. A
transition that cancels runs names them in ``Tx.stopped``; after its commit it publishes one
message on the live bus's stop topic, which every process listens to (Redis pub/sub across
hosts, in-process in embedded mode), and the process holding a handle of that run cancels it:
the HTTP stream is closed, the subprocess killed, within the watchdog's interval.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from shared.engine.runtime import LiveBus
from shared.llm.abort import Abort

__all__ = ["STOP_TOPIC", "holding", "listen", "stop", "stop_message"]

log = logging.getLogger("treadle.stopper")
STOP_TOPIC = "_stop"
"""The live bus channel (a pseudo run id) every process listens to for stops."""

_held: dict[str, set[Abort]] = defaultdict(set)
_lock = threading.Lock()
_listening: set[int] = set()


@contextmanager
def holding(run_id: str, abort: Abort) -> Iterator[Abort]:
    """Register ``abort`` as work in flight for ``run_id`` while the block runs."""
    with _lock:
        _held[run_id].add(abort)
    try:
        yield abort
    finally:
        with _lock:
            aborts = _held.get(run_id)
            if aborts is not None:
                aborts.discard(abort)
                if not aborts:
                    del _held[run_id]


def stop(run_id: str, reason: str = "the run was cancelled") -> int:
    """Cancel every handle this process holds for ``run_id``; returns how many."""
    with _lock:
        aborts = list(_held.get(run_id, ()))
    for abort in aborts:
        abort.cancel(reason)
    return len(aborts)


def stop_message(run_ids: list[str]) -> dict[str, Any]:
    return {"type": "stop", "run_ids": run_ids}


def listen(bus: LiveBus) -> None:
    """Listen to the stop topic of this bus (once per bus and process)."""
    with _lock:
        if id(bus) in _listening:
            return
        _listening.add(id(bus))

    def on_message(message: dict[str, Any]) -> None:
        for run_id in message.get("run_ids") or ():
            if stop(str(run_id)):
                log.info("stopped the work in flight of run %s", run_id)

    bus.subscribe(STOP_TOPIC, on_message)
