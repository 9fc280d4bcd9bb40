"""Thin Celery tasks with explicit names. Ids in, nothing out (no result backend)."""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy.exc import OperationalError

from shared.engine import metrics
from shared.engine.reaper import reap
from shared.engine.round import RetryRound, run_round
from shared.engine.toolrun import run_tool
from shared.engine.webhooks import deliver
from shared.logs import log_context
from worker.app import app
from worker.runtime import get_runtime

__all__ = ["reap_task", "round_task", "tool_task", "webhook_task"]

log = logging.getLogger("treadle.tasks")
_DB_RETRY = {"countdown": 2, "max_retries": 5}


@app.task(
    name="treadle.round", bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=None
)
def round_task(
    self: Any, run_id: str, version: int, outbox_id: int | None = None, attempt: int = 0
) -> None:
    try:
        with log_context(run_id=run_id, task="round"):
            run_round(get_runtime(), run_id, int(version), outbox_id, attempt=attempt)
    except RetryRound as r:
        log.info("round %s v%s retry in %.1fs: %s", run_id, version, r.delay, r.cause)
        nxt = attempt + 1 if r.counts else attempt
        raise self.retry(
            args=(run_id, version, outbox_id, nxt), countdown=r.delay, max_retries=None
        ) from None
    except OperationalError as exc:  # database down: retry soon; the reaper re-drives anyway
        metrics.RETRIES.labels(cause="database").inc()
        if self.request.retries < _DB_RETRY["max_retries"]:
            raise self.retry(countdown=_DB_RETRY["countdown"], max_retries=None) from exc
        log.warning("round %s: database unavailable; leaving it to the reaper", run_id)


@app.task(
    name="treadle.tool", bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=None
)
def tool_task(
    self: Any, run_id: str, call_id: str, version: int, outbox_id: int | None = None
) -> None:
    try:
        with log_context(run_id=run_id, call_id=call_id, task="tool"):
            run_tool(get_runtime(), run_id, call_id, int(version), outbox_id)
    except OperationalError as exc:
        metrics.RETRIES.labels(cause="database").inc()
        if self.request.retries < _DB_RETRY["max_retries"]:
            raise self.retry(countdown=_DB_RETRY["countdown"], max_retries=None) from exc
        log.warning("tool %s/%s: database unavailable; leaving it to the reaper", run_id, call_id)


@app.task(
    name="treadle.webhook", bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=None
)
def webhook_task(self: Any, delivery_id: str, outbox_id: int | None = None) -> None:
    """One try of one webhook delivery; its retries are scheduled in the database."""
    try:
        deliver(get_runtime(), delivery_id, outbox_id)
    except OperationalError as exc:
        metrics.RETRIES.labels(cause="database").inc()
        if self.request.retries < _DB_RETRY["max_retries"]:
            raise self.retry(countdown=_DB_RETRY["countdown"], max_retries=None) from exc
        log.warning("webhook %s: database unavailable; leaving it to the reaper", delivery_id)


@app.task(name="treadle.reap", ignore_result=True)
def reap_task() -> None:
    reap(get_runtime())
