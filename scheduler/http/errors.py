"""Errors as ``{"error": {"code", "message", "details"?}}`` (docs/api.md).

The database or the broker (or Redis) unreachable is a ``503`` with ``Retry-After``, in the
same shape, never a plain-text 500: the request wrote nothing, and may be sent again.
"""

from __future__ import annotations

import logging
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
    "error_body",
    "error_response",
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


def _field_errors(errors: list[Any]) -> list[dict[str, Any]]:
    return [
        {
            "path": ".".join(str(p) for p in e.get("loc", ())),
            "message": e.get("msg", ""),
            "type": e.get("type", ""),
        }
        for e in errors
    ]


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(sa_exc.SQLAlchemyError)
    async def _database(_: Request, exc: sa_exc.SQLAlchemyError) -> JSONResponse:
        what = outage(exc)
        if what is None:
            raise exc
        return _outage_response(exc, what)

    @app.exception_handler(Exception)  # raised outside the routes (middleware) or unknown
    async def _unhandled(_: Request, exc: Exception) -> JSONResponse:
        what = outage(exc)
        if what is not None:
            return _outage_response(exc, what)
        log.error("unhandled %s", type(exc).__name__, exc_info=exc)
        return JSONResponse(error_body("internal_error", "internal error"), status_code=500)

    @app.exception_handler(TreadleError)
    async def _treadle(_: Request, exc: TreadleError) -> JSONResponse:
        status = next((s for t, s in _STATUS.items() if isinstance(exc, t)), 400)
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        return JSONResponse(error_body(exc.code, str(exc)), status_code=status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        details = _field_errors(list(exc.errors()))
        first = details[0] if details else {"path": "", "message": "invalid request"}
        msg = f"{first['path']}: {first['message']}" if first["path"] else first["message"]
        return JSONResponse(error_body("invalid_request", msg, details), status_code=422)

    @app.exception_handler(ValidationError)
    async def _pydantic(_: Request, exc: ValidationError) -> JSONResponse:
        details = _field_errors(list(exc.errors()))
        return JSONResponse(
            error_body("invalid_request", "invalid request", details), status_code=422
        )

    @app.exception_handler(StarletteHTTPException)
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
