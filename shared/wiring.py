"""The composition root: the process-wide Runtime (database engine, Celery publisher, live
bus, rate limiter, model profiles) built from the settings, once per process.

The API, the CLI, embedded mode and the worker all get their Runtime here (and tracing its
way to a run's stored trace context), so none of them imports another's package for it. The
publisher sends dispatches as Celery tasks *by name* (``shared.names``); the webhook body
renderers of the facades travel on the runtime to the store, which never looks them up by
module path.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from celery import Celery
from sqlalchemy.engine import Engine

from shared import tracing
from shared.config import get_settings
from shared.engine.depth import BrokerDepth
from shared.engine.livebus import InProcessBus, LiveBus
from shared.engine.runtime import Dispatch, Runtime
from shared.llm.profiles import load_profiles
from shared.llm.ratelimit import LocalLimiter, RateLimiter, RedisLimiter
from shared.names import DISPATCH_TASKS, PRIORITY_HEADER, SENT_HEADER
from shared.priorities import DEFAULT_PRIORITY, broker_priority
from shared.store import runs as run_store
from shared.store.db import get_engine, reading

__all__ = [
    "CeleryPublisher",
    "get_runtime",
    "publish",
    "reset_runtime",
    "set_runtime",
    "task_args",
]

log = logging.getLogger("treadle.publish")
_runtime: Runtime | None = None
_lock = threading.Lock()


def task_args(d: Dispatch) -> list[Any]:
    """The positional arguments of the task a dispatch sends."""
    if d.kind == "tool":
        return [d.run_id, d.call_id, d.version]
    if d.kind == "webhook":
        return [d.delivery_id, d.outbox_id]
    return [d.run_id, d.version, d.attempt]


class CeleryPublisher:
    """Sends dispatches to a Celery broker. A failure is logged: the reaper re-sends later."""

    def __init__(self, celery_app: Celery | None = None) -> None:
        self._app = celery_app

    @property
    def app(self) -> Celery:
        if self._app is None:
            from shared.celery_app import app

            self._app = app
        return self._app

    def __call__(self, items: list[Dispatch]) -> None:
        for d in items:
            priority = DEFAULT_PRIORITY if d.priority is None else d.priority
            try:
                self.app.send_task(
                    DISPATCH_TASKS[d.kind],
                    args=task_args(d),
                    countdown=d.countdown,
                    priority=broker_priority(str(self.app.conf.broker_url or ""), priority),
                    headers=_headers(d, priority),
                )
            except Exception:
                log.warning(
                    "publish failed for %s %s; the reaper will re-send",
                    d.kind,
                    d.run_id,
                    exc_info=True,
                )


def _headers(d: Dispatch, priority: int) -> dict[str, Any]:
    """The dispatch's trace context (when tracing is on), and when it went out at which
    priority (``shared.names.SENT_HEADER``: the reaper's proof that a queue lost it)."""
    headers: dict[str, Any] = dict(tracing.dispatch_headers(d.kind, d.run_id) or {})
    headers[SENT_HEADER] = time.time()
    headers[PRIORITY_HEADER] = priority
    return headers


publish = CeleryPublisher()


def _make_bus() -> LiveBus:
    url = get_settings().live_redis_url
    if url:
        from shared.engine.livebus import RedisBus

        return RedisBus(url)
    return InProcessBus()


def _make_limiter() -> RateLimiter:
    settings = get_settings()
    url, cap = settings.live_redis_url, settings.retry_after_max_s
    if url:
        return RedisLimiter(url, prefix=f"{settings.broker_prefix}treadle:limit:", max_pause=cap)
    return LocalLimiter(max_pause=cap)


def _stored_trace(engine: Engine) -> Callable[[str], dict[str, str] | None]:
    """Reads the trace context stored with a run (a dispatch re-sent by the reaper)."""

    def load(run_id: str) -> dict[str, str] | None:
        with reading(engine) as conn:
            return run_store.run_trace(conn, run_id)

    return load


def get_runtime() -> Runtime:
    global _runtime
    with _lock:
        if _runtime is None:
            settings = get_settings()
            settings.ensure_dirs()
            settings.load_plugins()
            profiles = load_profiles(settings.profiles_file) if settings.profiles_file else {}
            engine = get_engine(settings.database_url)
            tracing.use_root_loader(_stored_trace(engine))
            _runtime = Runtime(
                engine=engine,
                settings=settings,
                publish=publish,
                live=_make_bus(),
                profiles=profiles,
                limiter=_make_limiter(),
                queue_depth=BrokerDepth(settings),
            )
        return _runtime


def set_runtime(rt: Runtime | None) -> None:
    global _runtime
    with _lock:
        _runtime = rt


def reset_runtime() -> None:
    set_runtime(None)
