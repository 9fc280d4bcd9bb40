"""The retry policy every task shares, written once: a database outage retries soon.

``OperationalError`` (the database is down or unreachable) retries the task after
``DB_RETRY_COUNTDOWN`` seconds, up to ``DB_MAX_RETRIES`` times; then the task gives up
quietly, because nothing is lost: the run's state still says the work is due, and the reaper
re-drives it once the database is back. A statement that gave up waiting on a lock
(``lock_timeout``: another session, perhaps a paused or cut-off worker, holds the row) is not
an outage: the task is dropped at once, rolled back, and the reaper re-drives the work when it
is due; so a held lock never parks a thread nor loops a message. Any other error is the
task's own business.
"""

from __future__ import annotations

import logging
from typing import ParamSpec

from celery import Task
from sqlalchemy.exc import OperationalError

from shared.engine import metrics
from shared.store.db import lock_busy

__all__ = ["DB_MAX_RETRIES", "DB_RETRY_COUNTDOWN", "DatabaseRetry"]

log = logging.getLogger("treadle.tasks")
DB_RETRY_COUNTDOWN = 2.0
DB_MAX_RETRIES = 5
_P = ParamSpec("_P")


class DatabaseRetry(Task[_P, None]):
    """A task base: acknowledged after it ran (a killed worker's message is redelivered),
    retried without a count limit of Celery's own; ``OperationalError`` → retry soon, then
    leave it to the reaper."""

    acks_late = True
    reject_on_worker_lost = True
    max_retries = None

    def __call__(self, *args: _P.args, **kwargs: _P.kwargs) -> None:
        # the worker's tracer has pushed the request already: call ``run``, not super()
        try:
            return self.run(*args, **kwargs)
        except OperationalError as exc:
            if lock_busy(exc):
                metrics.STALE.labels(reason="locked").inc()
                log.info("%s%r: a row is held elsewhere (%s); dropped", self.name, args, exc.orig)
                return None
            metrics.RETRIES.labels(cause="database").inc()
            if self.request.retries < DB_MAX_RETRIES:
                raise self.retry(countdown=DB_RETRY_COUNTDOWN, max_retries=None) from exc
            log.warning("%s%r: database unavailable; leaving it to the reaper", self.name, args)
            return None
