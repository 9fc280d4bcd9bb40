"""The Celery application. ``celery -A worker.app worker`` or ``treadle worker``."""

from __future__ import annotations

from typing import Any

from celery import Celery
from celery.signals import worker_init

from shared.config import Settings, get_settings

__all__ = ["ALL_QUEUES", "ROUNDS_QUEUE", "TOOLS_QUEUE", "WEBHOOKS_QUEUE", "app", "celery_config"]

ROUNDS_QUEUE = "treadle.rounds"
TOOLS_QUEUE = "treadle.tools"
WEBHOOKS_QUEUE = "treadle.webhooks"  # outbound webhooks: a slow receiver never delays a round
ALL_QUEUES = (ROUNDS_QUEUE, TOOLS_QUEUE, WEBHOOKS_QUEUE)


def _transport_options(settings: Settings) -> dict[str, Any]:
    if settings.embedded:
        # memory:// polls once a second by default (a 200-hop chain took 200 s)
        return {"polling_interval": 0.005}
    if settings.broker_url.startswith(("redis://", "rediss://")):
        prefix = {"global_keyprefix": settings.broker_prefix} if settings.broker_prefix else {}
        return {
            **prefix,
            "visibility_timeout": settings.visibility_timeout,
            "socket_timeout": 30,
            "socket_connect_timeout": 10,
            "health_check_interval": 25,
            "retry_on_timeout": True,
        }
    return {}


def celery_config(settings: Settings) -> dict[str, Any]:
    return {
        "broker_url": settings.broker_url,
        "broker_transport_options": _transport_options(settings),
        "broker_connection_retry_on_startup": True,
        "result_backend": None,
        "task_ignore_result": True,
        "task_serializer": "json",
        "accept_content": ["json"],
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "worker_hijack_root_logger": False,
        "worker_redirect_stdouts": False,
        # events cost ~25 % of a hop (bench/floor.py); Flower enables them when it runs
        "worker_send_task_events": settings.task_events,
        "task_send_sent_event": settings.task_events,
        "task_default_queue": ROUNDS_QUEUE,
        "task_routes": {
            "treadle.round": {"queue": ROUNDS_QUEUE},
            "treadle.tool": {"queue": TOOLS_QUEUE},
            "treadle.reap": {"queue": ROUNDS_QUEUE},
            "treadle.webhook": {"queue": WEBHOOKS_QUEUE},
        },
        "beat_schedule": {
            "treadle-reaper": {"task": "treadle.reap", "schedule": settings.reaper_interval},
        },
    }


def make_app(settings: Settings | None = None) -> Celery:
    settings = settings or get_settings()
    celery = Celery("treadle")
    celery.conf.update(celery_config(settings))
    celery.conf.visibility_timeout = settings.visibility_timeout
    return celery


@worker_init.connect
def _on_worker_init(**_: Any) -> None:
    """Logging as configured; a /metrics endpoint when TREADLE_WORKER_METRICS_PORT is set."""
    from shared.logs import configure_logging

    settings = get_settings()
    configure_logging(settings.log_level, settings.log_format)
    if settings.worker_metrics_port:
        from prometheus_client import start_http_server

        start_http_server(settings.worker_metrics_port)


app = make_app()
import worker.tasks  # noqa: E402,F401  (registers the tasks on ``app``)
