"""Embedded mode: one process runs the API, a Celery worker on ``memory://`` in threads, and
the reaper loop, on a SQLite file."""

from __future__ import annotations

import logging
import threading
from typing import Any

from shared.engine.reaper import reap
from shared.engine.runtime import Runtime
from shared.store.db import migrate

__all__ = ["ReaperLoop", "start_embedded", "start_worker_thread"]

log = logging.getLogger("treadle.embedded")


def start_worker_thread(concurrency: int = 8) -> Any:
    """A Celery worker (threads pool) in a daemon thread of this process."""
    from celery.worker import WorkController

    from shared.celery_app import app
    from shared.names import ALL_QUEUES

    app.amqp.queues.select(list(ALL_QUEUES))
    worker = WorkController(
        app=app,
        pool_cls="threads",
        concurrency=concurrency,
        without_mingle=True,
        without_gossip=True,
        without_heartbeat=True,
        loglevel="WARNING",
        queues=list(ALL_QUEUES),
    )
    threading.Thread(target=worker.start, daemon=True, name="treadle-worker").start()
    return worker


class ReaperLoop:
    """The embedded reaper: ``reap`` every ``interval`` seconds in a daemon thread."""

    def __init__(self, rt: Runtime, interval: float) -> None:
        self.rt, self.interval = rt, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="treadle-reaper")

    def start(self) -> ReaperLoop:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                reap(self.rt)
            except Exception:
                log.warning("reaper pass failed", exc_info=True)


def start_embedded(rt: Runtime, concurrency: int = 8) -> tuple[Any, ReaperLoop]:
    migrate(rt.engine)
    worker = start_worker_thread(concurrency)
    return worker, ReaperLoop(rt, rt.settings.reaper_interval).start()
