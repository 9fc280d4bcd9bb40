"""The web console: static files served at ``/``, plus the two small read
endpoints it needs: ``GET /v1/agents`` (registered agents) and ``GET /v1/runs/{id}/usage``
(tokens, cost and latency per model call, for the per-round figures).

No build step: ``scheduler/static/`` holds plain ES modules and one stylesheet. Every console
file is served with a strict Content-Security-Policy (``CSP``: scripts, styles, images and
connections from this origin only; no inline script or style, no eval, no frames, no plugins,
no base or form target elsewhere), ``nosniff`` and no referrer: run data the console shows
(a tenant's text) cannot run as script even if it got into the page.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from fastapi.responses import FileResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from scheduler.http.agents import registered_agents
from scheduler.http.auth import ReadCaller
from scheduler.http.deps import RuntimeDep
from scheduler.http.routing import api_router
from shared.engine.runtime import Runtime
from shared.errors import NotFound
from shared.store import agents as agent_store
from shared.store import records
from shared.store import runs as run_store
from shared.store.db import reading

__all__ = ["CSP", "STATIC_DIR", "EventsQueryToken", "agent_summary", "router"]

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
_TYPES = {
    ".js": "text/javascript",
    ".css": "text/css",
    ".html": "text/html",
    ".svg": "image/svg+xml",
}
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; manifest-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'; object-src 'none'"
)
_HEADERS = {
    "Cache-Control": "no-cache",
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


def agent_summary(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """What the console shows of a registered agent (never an inline profile's secrets)."""
    model = spec.get("model", "demo")
    tools = [t if isinstance(t, str) else t.get("name") for t in spec.get("tools") or []]
    return {
        "name": name,
        "kind": spec.get("kind", "agent"),
        "model": model if isinstance(model, str) else model.get("name") or "inline",
        "tools": tools,
        "plan": bool(spec.get("plan")),
        "ask": bool(spec.get("ask")),
        "guarded": bool(spec.get("guarded")),
    }


def _static(path: str) -> Response:
    file = (STATIC_DIR / path).resolve()
    if STATIC_DIR not in file.parents or not file.is_file():
        raise NotFound(f"no console file {path!r}")
    media = _TYPES.get(file.suffix, "application/octet-stream")
    return FileResponse(file, media_type=media, headers=_HEADERS)


def _usage_rows(rt: Runtime, tenant: str, run_id: str) -> list[dict[str, Any]]:
    with reading(rt.engine) as conn:
        if run_store.get_run(conn, run_id, tenant) is None:
            raise NotFound(f"run {run_id} not found")
        return records.usage_of_run(conn, run_id)


router = api_router()


@router.get("/", include_in_schema=False)
def index() -> Response:
    return _static("index.html")


@router.get("/console", include_in_schema=False)
def console_root() -> Response:
    return RedirectResponse("/")


@router.get("/console/{path:path}", include_in_schema=False)
def asset(path: str) -> Response:
    return _static(path)


@router.get("/v1/agents", tags=["agents"])
def agents(rt: RuntimeDep, caller: ReadCaller) -> dict[str, Any]:
    """The agents a run may name: the registered ones (built-ins and
    ``TREADLE_AGENTS_FILE``), then the tenant's own (their latest ``version``): name,
    kind, model, tools."""
    registered = [agent_summary(n, s) for n, s in registered_agents().items()]
    with reading(rt.engine) as conn:
        own = agent_store.latest_versions(conn, caller.tenant, limit=500)
    mine = [{**agent_summary(v.name, v.spec), "version": v.version} for v in own]
    return {"agents": registered + mine}


@router.get("/v1/runs/{run_id}/usage", tags=["runs"])
def run_usage(run_id: str, rt: RuntimeDep, caller: ReadCaller) -> dict[str, Any]:
    """Tokens, cost and latency of each model call of the run, in order: the profile and
    model that served it; ``committed`` false for a call whose reply the run did not keep
    (cut short by a cancel, superseded by a steer, its worker lost, a broken stream): the
    provider bills it all the same, and so do the run's cost and its spend envelopes."""
    return {"usage": _usage_rows(rt, caller.tenant, run_id)}


class EventsQueryToken:
    """ASGI middleware: ``GET /v1/runs/{id}/events?access_token=KEY`` is served as if it came
    with ``Authorization: Bearer KEY`` (a browser's EventSource cannot set headers). Only that
    endpoint, and only when the request has no Authorization header of its own."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and _is_events(scope):
            token = _query_token(scope.get("query_string", b""))
            headers = scope.get("headers") or []
            if token and not any(k == b"authorization" for k, _ in headers):
                scope = {**scope, "headers": [*headers, (b"authorization", b"Bearer " + token)]}
        await self.app(scope, receive, send)


def _is_events(scope: Scope) -> bool:
    path = str(scope.get("path", ""))
    return (
        scope.get("method") == "GET" and path.startswith("/v1/runs/") and path.endswith("/events")
    )


def _query_token(query: bytes) -> bytes | None:
    for key, value in parse_qsl(query.decode("latin-1")):
        if key == "access_token" and value:
            return value.encode("latin-1")
    return None
