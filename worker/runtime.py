"""The process-wide Runtime: the database engine, the publisher and the live bus."""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import Celery

from shared.config import get_settings
from shared.engine.runtime import InProcessBus, LiveBus, OutboxItem, Runtime
from shared.llm.profiles import load_profiles
from shared.llm.ratelimit import LocalLimiter, RateLimiter, RedisLimiter
from shared.store.db import get_engine

__all__ = [
    "TASK_NAMES",
    "CeleryPublisher",
    "get_runtime",
    "publish",
    "reset_runtime",
    "set_runtime",
    "task_args",
]

log = logging.getLogger("treadle.publish")
TASK_NAMES = {"round": "treadle.round", "tool": "treadle.tool", "webhook": "treadle.webhook"}
_runtime: Runtime | None = None
_lock = threading.Lock()


def task_args(kind: str, payload: dict[str, Any], outbox_id: int) -> list[Any]:
    if kind == "tool":
        return [payload["run_id"], payload["call_id"], payload["version"], outbox_id]
    if kind == "webhook":
        return [payload["delivery_id"], outbox_id]
    return [payload["run_id"], payload["version"], outbox_id]


class CeleryPublisher:
    """Sends outbox rows to a Celery broker. A failure is logged: the reaper re-sends later."""

    def __init__(self, celery_app: Celery | None = None) -> None:
        self._app = celery_app

    @property
    def app(self) -> Celery:
        if self._app is None:
            from worker.app import app

            self._app = app
        return self._app

    def __call__(self, items: list[OutboxItem]) -> None:
        for outbox_id, kind, payload in items:
            try:
                self.app.send_task(TASK_NAMES[kind], args=task_args(kind, payload, outbox_id))
            except Exception:
                log.warning(
                    "publish failed for outbox %s; the reaper will re-send",
                    outbox_id,
                    exc_info=True,
                )


publish = CeleryPublisher()


def _make_bus() -> LiveBus:
    url = get_settings().live_redis_url
    if url:
        from shared.engine.livebus import RedisBus

        return RedisBus(url)
    return InProcessBus()


def _make_limiter() -> RateLimiter:
    url = get_settings().live_redis_url
    if url:
        return RedisLimiter(url, prefix=f"{get_settings().broker_prefix}treadle:limit:")
    return LocalLimiter()


def get_runtime() -> Runtime:
    global _runtime
    with _lock:
        if _runtime is None:
            settings = get_settings()
            settings.ensure_dirs()
            settings.load_plugins()
            profiles = load_profiles(settings.profiles_file) if settings.profiles_file else {}
            _runtime = Runtime(
                engine=get_engine(settings.database_url),
                settings=settings,
                publish=publish,
                live=_make_bus(),
                profiles=profiles,
                limiter=_make_limiter(),
            )
        return _runtime


def set_runtime(rt: Runtime | None) -> None:
    global _runtime
    with _lock:
        _runtime = rt


def reset_runtime() -> None:
    set_runtime(None)
