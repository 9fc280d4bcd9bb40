"""Who is calling: API keys, tenants and scopes on the HTTP API.

A request presents its key as ``Authorization: Bearer trd_...`` or ``X-API-Key: trd_...``; the
key names its tenant and scopes (``shared.store.keys``). Every route takes the caller from the
``require(scope)`` dependency and only ever reads its own tenant's rows: another tenant's run,
thread or file is a 404, exactly like one that does not exist.

``TREADLE_AUTH``: ``required`` or ``off``; empty (the default) is ``off`` only when the broker
is ``memory://`` (embedded) and the API binds to a loopback address. With auth off every request
is tenant ``default`` with every scope.

``AuthMiddleware`` checks the key of every ``/v1/``, ``/langgraph/``, ``/openai/``, ``/mcp`` and
``/a2a/`` request (but ``/langgraph/info``) before its body is read (401 first,
and a route someone forgets to guard is still behind a key); ``require`` checks the scope.
``POST /v1/runs/{id}/answer`` and ``/approval`` also accept the pause's resume token instead of a
key (``X-Resume-Token`` or ``Bearer rtk_...``): the key check is skipped, and the command checks
the token (``shared.engine.resume``).
"""

from __future__ import annotations

import ipaddress
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from scheduler.http.deliveries import resume_token
from scheduler.http.errors import ApiError, error_response
from shared.config import Settings
from shared.engine.runtime import Runtime
from shared.errors import ConfigError
from shared.store import keys
from shared.store.db import reading

__all__ = [
    "ANONYMOUS",
    "CALLER_KEY",
    "OFF",
    "REQUIRED",
    "AuthMiddleware",
    "Authenticator",
    "Caller",
    "ReadCaller",
    "RedactKeys",
    "ResumeCaller",
    "WriteCaller",
    "auth_mode",
    "check_bind",
    "is_loopback",
    "metrics_access",
    "require",
    "startup_line",
]

log = logging.getLogger("treadle.auth")

OFF, REQUIRED = "off", "required"
CALLER_KEY = "treadle.caller"  # the ASGI scope key the middleware leaves the caller under
_CALLER = CALLER_KEY
_RESUMABLE = re.compile(r"^/v1/runs/[^/]+/(answer|approval)$")
_GUARDED = ("/v1/", "/langgraph/", "/openai/", "/mcp", "/a2a/")
_OPEN = frozenset({"/langgraph/info"})


@dataclass(frozen=True, slots=True)
class Caller:
    """The tenant a request acts for, and what it may do. A resume-token caller has no tenant
    and no scope: the token itself names the one run and pause it may resume."""

    tenant: str
    scopes: frozenset[str]
    key_id: str | None = None
    resume_token: str | None = None

    def allows(self, scope: str) -> bool:
        return keys.ADMIN in self.scopes or scope in self.scopes

    @property
    def limit_key(self) -> str:
        """What per-key limits count against: the key, else (auth off) the tenant."""
        return self.key_id or f"tenant:{self.tenant}"


ANONYMOUS = Caller("default", frozenset(keys.SCOPES))


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host.lower() == "localhost"


def auth_mode(settings: Settings, host: str | None = None) -> str:
    """``TREADLE_AUTH``, or by default: off only for embedded mode bound to loopback."""
    if settings.auth:
        return settings.auth
    keyless = settings.embedded and is_loopback(host or settings.api_host)
    return OFF if keyless else REQUIRED


def startup_line(mode: str, host: str) -> str:
    """What ``treadle up`` / ``treadle api`` say about authentication at start."""
    if mode == OFF:
        return (
            f"auth: off (TREADLE_AUTH): no API keys, every request is tenant 'default' "
            f"with every scope; bound to {host} only"
        )
    return "auth: required: API keys (`treadle keys create --tenant NAME`)"


def check_bind(mode: str, host: str) -> None:
    """Keyless only on loopback: auth off on any other address is a configuration error."""
    if mode == OFF and not is_loopback(host):
        raise ConfigError(
            f"TREADLE_AUTH=off needs a loopback bind, not {host}: use API keys "
            "(TREADLE_AUTH=required) or bind to 127.0.0.1"
        )


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, "unauthorized", message, {"WWW-Authenticate": "Bearer"})


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The API key of a request: ``Authorization: Bearer <key>``, else ``X-API-Key``."""
    scheme, _, credential = (headers.get("authorization") or "").partition(" ")
    if scheme.lower() == "bearer" and credential.strip():
        return credential.strip()
    return (headers.get("x-api-key") or "").strip() or None


class Authenticator:
    """Turns a request's headers into a ``Caller`` (reads the key from the database)."""

    def __init__(self, get_rt: Callable[[], Runtime], mode: str | None = None) -> None:
        self.get_rt = get_rt
        self._mode = mode

    @property
    def mode(self) -> str:
        if self._mode is None:
            self._mode = auth_mode(self.get_rt().settings)
            log.info("API authentication: %s", self._mode)
        return self._mode

    def identify(self, headers: Mapping[str, str], *, resumable: bool = False) -> Caller:
        token = resume_token(headers.get("authorization"), headers.get("x-resume-token"))
        if resumable and token:
            return Caller("", frozenset(), resume_token=token)
        if self.mode == OFF:
            return ANONYMOUS
        secret = presented_key(headers)
        if secret is None:
            raise _unauthorized(
                "an API key is required: Authorization: Bearer <key>, or X-API-Key: <key>"
            )
        with reading(self.get_rt().engine) as conn:  # no ROLLBACK: prepared statements stay
            key = keys.find_key(conn, secret)
        if key is None:
            raise _unauthorized("invalid or revoked API key")
        return Caller(key.tenant, frozenset(key.scopes), key.id)

    def trusts_trace(self, headers: Mapping[str, str]) -> bool:
        """Whether a request's own trace context (``traceparent``, ``tracestate``) may be
        joined: its key holds the ``trace`` scope (or auth is off). Any other request starts a
        trace of its own (``shared.tracing``)."""
        try:
            return self.identify(headers).allows(keys.TRACE)
        except ApiError:
            return False


class AuthMiddleware:
    """Every ``/v1/`` request needs a valid key (or, on answer/approval, a resume token) before
    anything else happens to it; the caller is left in the scope for ``require``."""

    def __init__(self, app: ASGIApp, auth: Authenticator) -> None:
        self.app, self.auth = app, auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _guarded(str(scope.get("path", ""))):
            await self.app(scope, receive, send)
            return
        resumable = _is_resumable(scope)
        try:
            caller = await run_in_threadpool(
                self.auth.identify, Headers(scope=scope), resumable=resumable
            )
        except ApiError as exc:
            await error_response(exc)(scope, receive, send)
            return
        await self.app({**scope, _CALLER: caller}, receive, send)


def _guarded(path: str) -> bool:
    """The API, the facades, ``/mcp`` and ``/a2a/``; not the console's files, ``/healthz``,
    ``/metrics``, docs."""
    return path.startswith(_GUARDED) and path not in _OPEN


def _is_resumable(scope: Scope) -> bool:
    return scope.get("method") == "POST" and bool(_RESUMABLE.match(str(scope.get("path", ""))))


_bearer = HTTPBearer(
    auto_error=False,
    scheme_name="bearer",
    description="An API key: `Authorization: Bearer trd_...`",
)
_api_key = APIKeyHeader(
    name="X-API-Key",
    auto_error=False,
    scheme_name="apiKey",
    description="An API key in its own header",
)
BearerCredential = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
ApiKeyCredential = Annotated[str | None, Depends(_api_key)]


def _authenticator(request: Request) -> Authenticator:
    auth: Authenticator = request.app.state.auth
    return auth


def _checked_caller(request: Request) -> Caller | None:
    """The caller ``AuthMiddleware`` left in the scope (None: it did not check this request)."""
    caller = request.scope.get(_CALLER)
    return caller if isinstance(caller, Caller) else None


async def _caller_of(request: Request, resumable: bool) -> Caller:
    """The caller ``AuthMiddleware`` checked; without it (an app built without the
    middleware), the key is checked here, in a worker thread (it reads the database)."""
    if (caller := _checked_caller(request)) is not None:
        return caller
    identify = _authenticator(request).identify
    return await run_in_threadpool(identify, request.headers, resumable=resumable)


def _holding(caller: Caller, scope: str, resume: bool = False) -> Caller:
    """``caller``, if it holds ``scope`` (or, ``resume``, is a resume token); 403 otherwise."""
    if caller.resume_token is not None and resume:
        return caller
    if caller.resume_token is not None or not caller.allows(scope):
        raise ApiError(403, "forbidden", f"this API key lacks the {scope} scope")
    return caller


@cache
def require(scope: str, *, resume: bool = False) -> Callable[..., Awaitable[Caller]]:
    """A dependency: the caller, who must hold ``scope`` (403 otherwise). ``resume``: a resume
    token is accepted instead (answer, approval)."""

    async def dependency(
        request: Request, _bearer: BearerCredential = None, _key: ApiKeyCredential = None
    ) -> Caller:
        return _holding(await _caller_of(request, resume), scope, resume)

    dependency.__name__ = f"require_{scope.replace(':', '_')}"
    return dependency


ReadCaller = Annotated[Caller, Depends(require(keys.READ))]
"""A route's caller, holding ``runs:read``: ``def get(run_id: str, caller: ReadCaller)``."""
WriteCaller = Annotated[Caller, Depends(require(keys.WRITE))]
ResumeCaller = Annotated[Caller, Depends(require(keys.WRITE, resume=True))]
"""``runs:write``, or a resume token (``caller.resume_token``; ``caller.tenant`` is empty)."""


def metrics_access(
    request: Request, _bearer: BearerCredential = None, _key: ApiKeyCredential = None
) -> bool:
    """``/metrics``: open when ``TREADLE_METRICS_PUBLIC`` (the default), else an admin key.
    True when the scrape may see run counts (fleet-wide and per tenant): an admin key, or
    auth off; a public scrape without one sees process and queue metrics only."""
    auth = _authenticator(request)
    if not auth.get_rt().settings.metrics_public:
        _holding(_checked_caller(request) or auth.identify(request.headers), keys.ADMIN)
        return True
    try:
        return auth.identify(request.headers).allows(keys.ADMIN)
    except ApiError:
        return False


_SECRETS = re.compile(r"(access_token=)[^&\s\"']+|(trd_)[A-Za-z0-9_-]{8,}")


def _redact(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    return _SECRETS.sub(lambda m: (m.group(1) or m.group(2)) + "…", value)


class RedactKeys(logging.Filter):
    """Keeps API keys out of log lines (the console's ``?access_token=`` is in access logs)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = _redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(_redact(a) for a in record.args)
        return True
