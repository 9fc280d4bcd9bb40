"""Errors as ``{"error": {"code", "message", "details"?}}`` (docs/api.md).

The database or the broker (or Redis) unreachable is a ``503`` with ``Retry-After``, in the
same shape, never a plain-text 500: the request wrote nothing, and may be sent again.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from sqlalchemy import exc as sa_exc
from starlette.exceptions import HTTPException as StarletteHTTPException

from shared.errors import (
    ConfigError,
    Conflict,
    Forbidden,
    NotFound,
    SpecError,
    TooLarge,
    TreadleError,
    Unauthorized,
)

__all__ = [
    "ApiError",
    "allowed_methods",
    "client_path",
    "error_body",
    "error_response",
    "field_errors",
    "install_error_handlers",
    "outage",
    "unavailable",
]

log = logging.getLogger("treadle.api")
RETRY_AFTER_S = 5
_BROKER_ERRORS = ("OperationalError", "ConnectionError", "RecoverableConnectionError")

_STATUS = {  # the first match wins: a subclass before its base
    TooLarge: 413,
    NotFound: 404,
    Conflict: 409,
    SpecError: 422,
    ConfigError: 422,
    Unauthorized: 401,
    Forbidden: 403,
}
_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "too_large",
    429: "rate_limited",
    503: "unavailable",
}


class ApiError(HTTPException):
    """An HTTP error with its own ``code`` (auth, limits). A FastAPI ``HTTPException``, so one
    raised while the body is read (the body-size limit) is not turned into a 400."""

    def __init__(
        self, status: int, code: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(status, message, headers)
        self.code = code


def unavailable(message: str, retry_after: int = RETRY_AFTER_S) -> ApiError:
    return ApiError(503, "unavailable", message, {"Retry-After": str(retry_after)})


def outage(exc: BaseException) -> str | None:
    """What is down, when ``exc`` says a service the API needs is unreachable (or a row it
    needs stayed locked past ``lock_timeout``); None for any other error."""
    if isinstance(exc, sa_exc.OperationalError | sa_exc.TimeoutError):
        return "the database"
    if isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
        return "the database"
    for cls in type(exc).__mro__:
        module, name = cls.__module__, cls.__name__
        if module.startswith("redis") and name in ("ConnectionError", "TimeoutError"):
            return "Redis"
        if module.startswith(("kombu", "amqp")) and name in _BROKER_ERRORS:
            return "the broker"
    return None


def _outage_response(exc: BaseException, what: str) -> JSONResponse:
    log.warning("503: %s is unavailable (%s: %s)", what, type(exc).__name__, exc)
    return error_response(unavailable(f"{what} is unavailable; try again shortly"))


def allowed_methods(request: Request) -> str:
    """Every method of every route on the request's path (Starlette names only the first)."""
    methods: set[str] = set()
    for route in request.app.routes:
        regex = getattr(route, "path_regex", None)
        if regex is not None and regex.match(request.url.path):
            methods |= set(getattr(route, "methods", None) or ())
    return ", ".join(sorted(methods))


def error_response(exc: StarletteHTTPException) -> JSONResponse:
    code = getattr(exc, "code", None) or _CODES.get(exc.status_code, "http_error")
    return JSONResponse(
        error_body(code, str(exc.detail)),
        status_code=exc.status_code,
        headers=getattr(exc, "headers", None),
    )


def error_body(code: str, message: str, details: Any = None) -> dict[str, Any]:
    err: dict[str, Any] = {"code": code, "message": message}
    if details is not None:
        err["details"] = details
    return {"error": err}


_LOCATIONS = frozenset({"body", "query", "path", "header", "cookie"})
_UNKNOWN = object()  # the input under a location is not known: the loc is read by its shape
# pydantic's own steps in a location: a union member (``function-after[…]``, ``list[…]``,
# ``constrained-str``, ``str``, a model's class name), a dict key's ``[key]``
_PYDANTIC_STEP = re.compile(
    r"[\[\]()]|^[A-Z][A-Za-z0-9_]*$|^(constrained-)?(str|int|float|bool|bytes|none|dict|list)$"
)


def _step(node: Any, part: Any) -> tuple[bool, Any]:
    """Is ``part`` a key or index of the client's ``node``, and what is under it?"""
    if node is _UNKNOWN:
        known = isinstance(part, int) or not _PYDANTIC_STEP.search(str(part))
        return known, _UNKNOWN
    if isinstance(node, Mapping) and part in node:
        return True, node[part]
    if isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
        return True, node[part]
    return False, node


def client_path(loc: Sequence[Any], body: Any = _UNKNOWN, missing: bool = False) -> str:
    """The field as the client sent it (``agent.output_schema``, ``input.0.content``, ``limit``)
    from a pydantic error's ``loc``: the location (``body``, ``query``...) and pydantic's own
    steps (union members, validators) left out. ``body``: the parsed body the loc walks (a key
    or index it has is the client's, any other step pydantic's; a ``missing`` field's name is
    the loc's last step); without it, the steps are told apart by their shape."""
    parts, node = list(loc), body
    if parts and parts[0] in _LOCATIONS:
        node = body if parts[0] == "body" else _UNKNOWN
        parts = parts[1:]
    out: list[str] = []
    for i, part in enumerate(parts):
        known, node = _step(node, part)
        if known or (missing and i == len(parts) - 1):
            out.append(str(part))
    return ".".join(out)


def _wrong_branch(detail: dict[str, Any], paths: set[str]) -> bool:
    """A union member's type mismatch where another member's errors go deeper (``agent`` is
    not a string, but ``agent.output_schema`` is what is wrong with the object sent)."""
    prefix = f"{detail['path']}." if detail["path"] else ""
    deeper = any(p.startswith(prefix) and p != detail["path"] for p in paths)
    return detail["type"].endswith("_type") and deeper


def field_errors(errors: Sequence[Any], body: Any = _UNKNOWN) -> list[dict[str, Any]]:
    """pydantic's errors as ``{path, message, type}``, each path the client's field
    (``client_path``), without the other union members' type mismatches or repeats."""
    details: list[dict[str, Any]] = []
    for e in errors:
        kind = str(e.get("type", ""))
        path = client_path(e.get("loc", ()), body, missing=kind == "missing")
        detail = {"path": path, "message": str(e.get("msg", "")), "type": kind}
        if detail not in details:
            details.append(detail)
    paths = {d["path"] for d in details}
    return [d for d in details if not _wrong_branch(d, paths)] or details


def _invalid_request(details: list[dict[str, Any]], message: str | None = None) -> JSONResponse:
    first = details[0] if details else {"path": "", "message": "invalid request"}
    msg = f"{first['path']}: {first['message']}" if first["path"] else first["message"]
    return JSONResponse(error_body("invalid_request", message or msg, details), status_code=422)


async def _database(_: Request, exc: sa_exc.SQLAlchemyError) -> JSONResponse:
    what = outage(exc)
    if what is None:
        raise exc
    return _outage_response(exc, what)


async def _unhandled(_: Request, exc: Exception) -> JSONResponse:
    """Raised outside the routes (middleware) or unknown."""
    what = outage(exc)
    if what is not None:
        return _outage_response(exc, what)
    log.error("unhandled %s", type(exc).__name__, exc_info=exc)
    return JSONResponse(error_body("internal_error", "internal error"), status_code=500)


async def _treadle(_: Request, exc: TreadleError) -> JSONResponse:
    status = next((s for t, s in _STATUS.items() if isinstance(exc, t)), 400)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(error_body(exc.code, str(exc)), status_code=status, headers=headers)


async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
    return _invalid_request(field_errors(exc.errors(), exc.body))


async def _pydantic(_: Request, exc: ValidationError) -> JSONResponse:
    return _invalid_request(field_errors(exc.errors()))


async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    if exc.status_code == 405:
        exc.headers = {"Allow": allowed_methods(request)}
    if exc.status_code == 400 and exc.__cause__ is not None:  # FastAPI: body did not parse
        reason = (
            "not valid UTF-8"
            if isinstance(exc.__cause__, UnicodeDecodeError)
            else type(exc.__cause__).__name__
        )
        exc = HTTPException(400, f"the request body does not parse ({reason})")
    return error_response(exc)


_HANDLERS: tuple[tuple[type[Exception], Any], ...] = (
    (sa_exc.SQLAlchemyError, _database),
    (Exception, _unhandled),
    (TreadleError, _treadle),
    (RequestValidationError, _validation),
    (ValidationError, _pydantic),
    (StarletteHTTPException, _http),
)


def install_error_handlers(app: FastAPI) -> None:
    for kind, handler in _HANDLERS:
        app.add_exception_handler(kind, handler)
