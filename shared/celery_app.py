"""The Celery application both sides share. The API, the CLI and embedded mode send tasks
through it by name (``shared.names``); a worker process loads the task functions through
``include`` (``worker.tasks``) when it starts, so nothing here imports the worker package.
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from kombu import Exchange, Queue

from shared.config import Settings, get_settings
from shared.names import ALL_QUEUES, REAP_TASK, ROUNDS_QUEUE, TASK_QUEUES
from shared.priorities import DEFAULT_PRIORITY, PRIORITY_SEP, broker_priority, is_redis

__all__ = ["TASK_MODULES", "app", "celery_config", "make_app"]

TASK_MODULES = ["worker.tasks"]  # imported by a worker at start (Celery ``include``)


def _queues(settings: Settings) -> list[Queue] | None:
    """RabbitMQ: the queues declared with ``x-max-priority`` (message priorities 0-9)."""
    if not settings.broker_url.startswith(("amqp://", "amqps://", "pyamqp://")):
        return None
    args = {"x-max-priority": 10}
    return [Queue(q, Exchange(q), routing_key=q, queue_arguments=args) for q in ALL_QUEUES]


def _transport_options(settings: Settings) -> dict[str, Any]:
    if settings.embedded:
        # memory:// polls once a second by default (a 200-hop chain took 200 s)
        return {"polling_interval": 0.005}
    if is_redis(settings.broker_url):
        prefix = {"global_keyprefix": settings.broker_prefix} if settings.broker_prefix else {}
        return {
            **prefix,
            # message priorities: one list per priority, the lowest number read first
            "priority_steps": list(range(10)),
            "sep": PRIORITY_SEP,
            "visibility_timeout": settings.visibility_timeout,
            "socket_timeout": 30,
            "socket_connect_timeout": 10,
            "health_check_interval": 25,
            "retry_on_timeout": True,
        }
    if settings.broker_url.startswith(("amqp://", "amqps://", "pyamqp://")):
        # publisher confirms: a publish returns once RabbitMQ has the message (a broker that
        # dies right after a commit loses no dispatch the API or a worker saw as sent)
        return {"confirm_publish": True}
    return {}


def _broker_url(settings: Settings) -> str:
    """``memory://`` names its (only) host, or kombu warns on every connection."""
    return "memory://localhost/" if settings.broker_url == "memory://" else settings.broker_url


def celery_config(settings: Settings) -> dict[str, Any]:
    return {
        "broker_url": _broker_url(settings),
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
        "task_default_priority": broker_priority(settings.broker_url, DEFAULT_PRIORITY),
        "task_queues": _queues(settings),
        "task_routes": {name: {"queue": queue} for name, queue in TASK_QUEUES.items()},
        "beat_schedule": {
            "treadle-reaper": {
                "task": REAP_TASK,
                "schedule": settings.reaper_interval,
                # a pass not taken in time is dropped: the next one does its work
                "options": {"expires": max(10.0, 3 * settings.reaper_interval)},
            },
        },
    }


def make_app(settings: Settings | None = None) -> Celery:
    settings = settings or get_settings()
    celery = Celery("treadle", include=TASK_MODULES)
    celery.conf.update(celery_config(settings))
    celery.conf.visibility_timeout = settings.visibility_timeout
    return celery


app = make_app()
