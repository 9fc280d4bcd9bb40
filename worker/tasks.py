"""Thin Celery tasks, registered under the names in ``shared.names``. Ids in, nothing out (no
result backend); a database outage is retried by the base class (``worker.base``). Each task
is a span of its run's trace when tracing is on (``shared.tracing``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

from celery.worker import state as worker_state

from shared.engine.gate import Stage
from shared.engine.reaper import reap
from shared.engine.round import rounds_in_place, run_round
from shared.engine.runtime import Dispatch, Runtime
from shared.engine.toolrun import run_tool
from shared.engine.webhooks import deliver
from shared.logs import log_context
from shared.names import REAP_TASK, ROUND_TASK, TOOL_TASK, WEBHOOK_TASK
from shared.tracing import task_span
from shared.wiring import get_runtime
from worker.app import app
from worker.base import DatabaseRetry

__all__ = ["reap_task", "round_task", "tool_task", "webhook_task"]

log = logging.getLogger("treadle.tasks")


def _more(rt: Runtime) -> Callable[[int], bool]:
    """Whether a task drives its run's next round itself (``rounds_in_place``): for
    ``TREADLE_WORKER_IN_PLACE_S`` seconds from now, and not once the worker shuts down."""
    until = time.monotonic() + rt.settings.worker_in_place_s

    def more(_: int) -> bool:
        stopping = worker_state.should_stop is not None or worker_state.should_terminate is not None
        return time.monotonic() < until and not stopping

    return more


def _in_place(rt: Runtime, run_id: str) -> AbstractContextManager[Runtime]:
    """The runtime a task works with: as is (the default, every round its own task), or,
    with ``TREADLE_WORKER_IN_PLACE_S`` set, one that drives the run's next due round here."""
    if rt.settings.worker_in_place_s <= 0:
        return nullcontext(rt)
    return rounds_in_place(rt, run_id, _more(rt), _drive)


def _drive(rt: Runtime, d: Dispatch) -> None:
    """How a task drives a round in place: the round's own span in the run's trace (a child
    of the run's context, as a round task's would be) and a log line in place of Celery's."""
    started = time.monotonic()
    with task_span("treadle.round", None, d.run_id, version=d.version, in_place=True) as span:
        result = run_round(rt, d.run_id, d.version, d.attempt)
        span.set_attribute("treadle.outcome", result.status)
    log.info(
        "round %s v%s driven in place in %.3fs: %s",
        d.run_id,
        d.version,
        time.monotonic() - started,
        result.status,
    )


@app.task(name=ROUND_TASK, base=DatabaseRetry, bind=True)
def round_task(self: DatabaseRetry[...], run_id: str, version: int, attempt: int = 0) -> None:
    with (
        log_context(run_id=run_id, task="round"),
        task_span("treadle.round", self.request, run_id, version=version) as span,
    ):
        rt = get_runtime()
        with rt.gate.inside(Stage.CLAIM), _in_place(rt, run_id) as here:
            result = run_round(here, run_id, int(version), int(attempt))
        span.set_attribute("treadle.outcome", result.status)


@app.task(name=TOOL_TASK, base=DatabaseRetry, bind=True)
def tool_task(self: DatabaseRetry[...], run_id: str, call_id: str, version: int) -> None:
    with (
        log_context(run_id=run_id, call_id=call_id, task="tool"),
        task_span("treadle.tool", self.request, run_id, call_id=call_id) as span,
    ):
        rt = get_runtime()
        with rt.gate.inside(Stage.TOOL), _in_place(rt, run_id) as here:
            outcome = run_tool(here, run_id, call_id, int(version))
        span.set_attribute("treadle.outcome", outcome)


@app.task(name=WEBHOOK_TASK, base=DatabaseRetry, bind=True)
def webhook_task(self: DatabaseRetry[...], delivery_id: str, outbox_id: int | None = None) -> None:
    """One try of one webhook delivery; its retries are scheduled in the database."""
    with task_span("treadle.webhook", self.request, delivery_id=delivery_id) as span:
        outcome = deliver(get_runtime(), delivery_id, outbox_id)
        span.set_attribute("treadle.outcome", outcome)


@app.task(name=REAP_TASK, ignore_result=True)
def reap_task() -> None:
    reap(get_runtime())
