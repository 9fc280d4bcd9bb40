"""Operations routes: ``/healthz`` (database and broker) and ``/metrics`` (Prometheus)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, TypeVar

from fastapi import Depends, Response
from fastapi.responses import JSONResponse
from sqlalchemy.engine import Connection

from scheduler.http.auth import metrics_access
from scheduler.http.deps import RuntimeDep
from scheduler.http.routing import api_router
from shared.engine import metrics
from shared.engine.depth import BrokerDepth
from shared.engine.runtime import Runtime
from shared.store import stats
from shared.store.db import reading

__all__ = ["router"]

T = TypeVar("T")


router = api_router(tags=["ops"])


@router.get("/healthz")
def healthz(rt: RuntimeDep) -> JSONResponse:
    checks = {"database": _check_db(rt), "broker": _check_broker(rt)}
    ok = all(v == "ok" for v in checks.values())
    return JSONResponse(
        {"status": "ok" if ok else "degraded", "checks": checks}, status_code=200 if ok else 503
    )


@router.get("/metrics", include_in_schema=False)
def prometheus(admin: Annotated[bool, Depends(metrics_access)], rt: RuntimeDep) -> Response:
    """Run counts (fleet-wide, and per tenant) only for an admin scrape."""
    collector = metrics.StateCollector(
        _counts(rt, stats.runs_by_status) if admin else None,
        lambda: _queue_depth(rt),
        _counts(rt, stats.runs_by_tenant) if admin else None,
        _counts(rt, stats.spend_by_scope) if admin else None,
    )
    return Response(metrics.render(collector), media_type=metrics.CONTENT_TYPE_LATEST)


def _counts(rt: Runtime, query: Callable[[Connection], T]) -> Callable[[], T]:
    def read() -> T:
        with reading(rt.engine) as conn:
            return query(conn)

    return read


def _queue_depth(rt: Runtime) -> dict[str, int]:
    """Messages waiting per queue (Redis or RabbitMQ; other brokers: none)."""
    depth = rt.queue_depth or BrokerDepth(rt.settings)
    return depth() or {}


def _check_db(rt: Runtime) -> str:
    try:
        with reading(rt.engine) as conn:
            stats.ping(conn)
        return "ok"
    except Exception as exc:
        return f"error: {type(exc).__name__}"


def _check_broker(rt: Runtime) -> str:
    if rt.settings.embedded:
        return "ok"
    try:
        from shared.celery_app import app

        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
        return "ok"
    except Exception as exc:
        return f"error: {type(exc).__name__}"
