"""The ASGI application: the native API (``scheduler.http``), the interop facades
(``scheduler.interop``) and the web console under one FastAPI app (docs/api.md)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.routing import Route

from scheduler.http import limits
from scheduler.http.agent_routes import router as agent_router
from scheduler.http.auth import Authenticator, AuthMiddleware, RedactKeys
from scheduler.http.bodyguard import BodyGuard
from scheduler.http.console import EventsQueryToken
from scheduler.http.console import router as console_router
from scheduler.http.cron_routes import router as cron_router
from scheduler.http.datasets import router as datasets_router
from scheduler.http.errors import install_error_handlers
from scheduler.http.files import router as files_router
from scheduler.http.files import upload_overhead
from scheduler.http.fleet import router as fleet_router
from scheduler.http.lifecycle import router as lifecycle_router
from scheduler.http.memory import router as memory_router
from scheduler.http.openapi import install_openapi
from scheduler.http.ops import router as ops_router
from scheduler.http.retention_routes import router as retention_router
from scheduler.http.runs import router as runs_router
from scheduler.http.schemas import ERROR_RESPONSES
from scheduler.http.spend import router as spend_router
from scheduler.http.threads import router as threads_router
from scheduler.interop.a2a.server import install_a2a
from scheduler.interop.langgraph.routes import router as langgraph_router
from scheduler.interop.langgraph.store import router as lg_store_router
from scheduler.interop.mcp.server import McpService
from scheduler.interop.openai.responses import router as openai_router
from shared import tracing
from shared.config import Settings, get_settings
from shared.engine.runtime import Runtime
from shared.store.db import ping_on_checkout
from shared.wiring import get_runtime

__all__ = ["create_app"]


def _body_limit_for(get_rt: Callable[[], Runtime]) -> Callable[[str], tuple[int, str]]:
    def limit_for(path: str) -> tuple[int, str]:
        if path == "/v1/files":  # uploads: the file size limit (setting)
            max_file = get_rt().settings.files_max_bytes
            return max_file + upload_overhead, f"file over the {max_file}-byte limit"
        return limits.BODY_LIMIT, "request body over 2 MB"

    return limit_for


def _redact_access_logs() -> None:
    for name in ("uvicorn.access", "uvicorn.error"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactKeys) for f in logger.filters):
            logger.addFilter(RedactKeys())


def create_app(get_rt: Callable[[], Runtime] | None = None, *, auth: str | None = None) -> FastAPI:
    """The API. ``auth``: ``"required"`` or ``"off"``; None = ``TREADLE_AUTH``, or by default
    off only for embedded mode on loopback (``scheduler.http.auth.auth_mode``)."""
    tracing.configure("treadle-api")  # on when the OTEL_* variables ask for it
    get_rt = _pinging(get_rt or get_runtime)
    app = FastAPI(
        lifespan=_lifespan,
        title="treadle",
        version="0.1.0",
        description=(
            "Durable, distributed execution of LLM agents on Celery.\n\n"
            "Every JSON body is refused (422) when it holds a NUL character, a number that is "
            "not finite, or nesting deeper than 64 levels; `metadata` is at most 16 KB and 8 "
            "levels deep."
        ),
    )
    app.state.get_rt = get_rt  # scheduler.http.deps.RuntimeDep
    app.state.auth = authenticator = Authenticator(get_rt, auth)
    install_error_handlers(app)
    app.include_router(runs_router)
    app.include_router(fleet_router)  # search's bulk actions: cancel, suspend, resume
    app.include_router(lifecycle_router)  # resume, fork, messages, plan
    app.include_router(agent_router)
    app.include_router(threads_router)
    app.include_router(cron_router)
    app.include_router(retention_router)
    app.include_router(ops_router)
    app.include_router(spend_router, responses=ERROR_RESPONSES)
    app.include_router(files_router)
    app.include_router(datasets_router, responses=ERROR_RESPONSES)  # the knowledge base
    app.include_router(memory_router, responses=ERROR_RESPONSES)  # long-term memory
    app.include_router(console_router)
    app.include_router(langgraph_router, prefix="/langgraph")  # interop facades
    app.include_router(lg_store_router, prefix="/langgraph")  # the LangGraph Store
    app.include_router(openai_router, prefix="/openai/v1")
    app.state.mcp = McpService()  # /mcp: agents as MCP tools (its sessions run in the lifespan)
    app.router.routes.append(Route("/mcp", endpoint=app.state.mcp, include_in_schema=False))
    install_a2a(app)  # /a2a/{agent}: agents as A2A servers (card, JSON-RPC)
    _wrap(app, authenticator, get_rt)
    install_openapi(app, lambda: _settings_of(get_rt))
    _redact_access_logs()
    return app


def _wrap(app: FastAPI, authenticator: Authenticator, get_rt: Callable[[], Runtime]) -> None:
    """The middleware around every route. Added outermost last: body size, then
    ?access_token= (EventSource), then the key check; outermost of all, the request's span."""
    app.add_middleware(BodyGuard)  # hostile JSON: depth, non-finite numbers, NUL
    app.add_middleware(AuthMiddleware, auth=authenticator)
    app.add_middleware(EventsQueryToken)  # ?access_token= on the SSE route (EventSource)
    app.add_middleware(limits.BodyLimit, limit_for=_body_limit_for(get_rt))
    # a client's trace context is joined only for a key with the trace scope
    tracing.instrument_app(app, trusted=authenticator.trusts_trace)


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """While the app serves: the MCP server's session manager."""
    async with app.state.mcp.running():
        yield


def _pinging(get_rt: Callable[[], Runtime]) -> Callable[[], Runtime]:
    """The API's runtime, its database pool testing each connection before a request uses
    it: after a database restart (or a killed session) no request fails on a dead one."""

    def get() -> Runtime:
        rt = get_rt()
        ping_on_checkout(rt.engine)
        return rt

    return get


def _settings_of(get_rt: Callable[[], Runtime]) -> Settings:
    """The running app's settings; the configured ones when the runtime is not there yet (the
    schema can be read before the app serves)."""
    try:
        rt = get_rt()
    except Exception:
        rt = None
    return rt.settings if rt is not None else get_settings()
