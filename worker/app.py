"""The worker's entry point: ``celery -A worker.app worker`` or ``treadle worker``.

The Celery app is ``shared.celery_app.app`` (the API sends tasks through it by name); its
``include`` loads ``worker.tasks`` when a worker starts, and ``worker.tasks`` imports this
module, so the process hook below is connected in every worker however it was started.
"""

from __future__ import annotations

from typing import Any

from celery.signals import worker_init, worker_shutdown

from shared.celery_app import app
from shared.config import get_settings

__all__ = ["app"]


@worker_init.connect
def _on_worker_init(**_: Any) -> None:
    """Logging as configured; a /metrics endpoint when TREADLE_WORKER_METRICS_PORT is set;
    traces when the ``OTEL_*`` variables ask for them."""
    from shared import tracing
    from shared.logs import configure_logging

    settings = get_settings()
    configure_logging(settings.log_level, settings.log_format)
    tracing.configure("treadle-worker")
    if settings.worker_metrics_port:
        from prometheus_client import start_http_server

        start_http_server(settings.worker_metrics_port)


@worker_shutdown.connect
def _on_worker_shutdown(**_: Any) -> None:
    """Send the spans still buffered."""
    from shared import tracing

    tracing.shutdown()
