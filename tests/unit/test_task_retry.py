"""The database-outage retry, written once in the task base class (``worker.base``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from celery import Celery
from celery.exceptions import Retry
from sqlalchemy.exc import OperationalError

from shared.engine import metrics
from worker.base import DB_MAX_RETRIES, DatabaseRetry


@pytest.fixture
def app() -> Iterator[Celery]:
    celery = Celery("retry-test", broker="memory://", set_as_current=False)
    yield celery
    celery.close()


def _down(app: Celery) -> DatabaseRetry[...]:
    @app.task(name="test.down", base=DatabaseRetry, bind=True)
    def down(self: DatabaseRetry[...], run_id: str) -> None:
        raise OperationalError("SELECT 1", {}, Exception("connection refused"))

    return down


def _retries() -> float:
    return float(metrics.RETRIES.labels(cause="database")._value.get())


def test_a_database_outage_retries_the_task(app: Celery) -> None:
    task, before = _down(app), _retries()
    task.push_request(retries=0, id="t1", args=["r1"], kwargs={})
    try:
        with pytest.raises(Retry):
            task("r1")
    finally:
        task.pop_request()
    assert _retries() == before + 1


def test_after_the_last_retry_the_reaper_takes_over(
    app: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    task = _down(app)
    task.push_request(retries=DB_MAX_RETRIES, id="t2", args=["r2"], kwargs={})
    try:
        task("r2")  # no exception: acknowledged, the outbox row stays for the reaper
    finally:
        task.pop_request()
    assert "leaving it to the reaper" in caplog.text


def test_the_policy_is_on_every_durable_task() -> None:
    from worker.tasks import round_task, tool_task, webhook_task

    for task in (round_task, tool_task, webhook_task):
        assert isinstance(task, DatabaseRetry)
        assert task.acks_late and task.reject_on_worker_lost
