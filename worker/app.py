"""The worker's entry point: ``celery -A worker.app worker`` or ``treadle worker``.

The Celery app is ``shared.celery_app.app`` (the API sends tasks through it by name); its
``include`` loads ``worker.tasks`` when a worker starts, and ``worker.tasks`` imports this
module, so the process hook below is connected in every worker however it was started.
"""

from __future__ import annotations

from typing import Any

from celery.signals import task_received, worker_init, worker_shutdown

from shared.celery_app import app
from shared.config import Settings, get_settings
from shared.names import PRIORITY_HEADER, SENT_HEADER, TASK_QUEUES
from shared.priorities import DEFAULT_PRIORITY

__all__ = ["adopt_concurrency", "app"]


@worker_init.connect
def _on_worker_init(sender: Any = None, **_: Any) -> None:
    """The process's concurrency is the worker's ``-c`` (what the pools are sized for);
    logging as configured; a /metrics endpoint when TREADLE_WORKER_METRICS_PORT is set;
    traces when the ``OTEL_*`` variables ask for them."""
    from shared import tracing
    from shared.logs import configure_logging

    settings = get_settings()
    adopt_concurrency(settings, getattr(sender, "concurrency", None))
    configure_logging(settings.log_level, settings.log_format)
    tracing.configure("treadle-worker")
    if settings.worker_metrics_port:
        from prometheus_client import start_http_server

        start_http_server(settings.worker_metrics_port)


def adopt_concurrency(settings: Settings, concurrency: object) -> None:
    """``celery worker -c N`` sets the threads; unless ``TREADLE_WORKER_CONCURRENCY`` says
    otherwise, the settings follow it, so the database and model-client pools (sized from
    ``worker_concurrency``) never hold in-flight work below ``-c``."""
    if "worker_concurrency" in settings.model_fields_set:
        return
    if isinstance(concurrency, int) and concurrency > 0:
        settings.worker_concurrency = concurrency


@worker_shutdown.connect
def _on_worker_shutdown(**_: Any) -> None:
    """Send the spans and the live messages still buffered."""
    from shared import tracing
    from shared.wiring import get_runtime

    tracing.shutdown()
    get_runtime().live.flush(2.0)


@task_received.connect
def _on_task_received(request: Any = None, **_: Any) -> None:
    """Note what this process took from its queues: the newest dispatch per queue and
    priority, written with its heartbeat (``shared.engine.leases.Heartbeat.received``)."""
    from shared.wiring import get_runtime

    headers = getattr(request, "request_dict", None) or {}
    sent, queue = headers.get(SENT_HEADER), TASK_QUEUES.get(getattr(request, "name", ""))
    if sent is None or queue is None:
        return
    priority = int(headers.get(PRIORITY_HEADER, DEFAULT_PRIORITY))
    get_runtime().heartbeat.received(queue, priority, float(sent))
