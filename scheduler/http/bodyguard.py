"""Hostile input stopped at the edge, before any route (or its database writes) sees it.

``BodyGuard`` (ASGI middleware, inside the key check: a caller without a key gets its 401
before its body is read) refuses with ``422``:

* a path or query string with NUL or another control character (``/v1/runs/%00``);
* a JSON body nested deeper than ``MAX_DEPTH`` (also one deep enough to exhaust the parser),
  with a number that is not finite (``NaN``, ``Infinity``, ``1e999``), or with NUL in any
  string or key (``scheduler.http.nul_free`` states it in the OpenAPI document);
* a top-level ``metadata`` object over ``MAX_METADATA_BYTES`` as JSON or ``MAX_DEPTH_METADATA``
  deep (it is stored with the run or thread and returned in every listing).

The body's size is the body limit's job (``scheduler.limits.BodyLimit``, outside this). The
body is read once, checked, and handed on unchanged.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote_to_bytes

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from scheduler.http.errors import ApiError, error_response
from scheduler.http.nul_free import NUL

__all__ = [
    "MAX_DEPTH",
    "MAX_DEPTH_METADATA",
    "MAX_METADATA_BYTES",
    "BodyGuard",
    "check_json",
]

MAX_DEPTH = 64
MAX_DEPTH_METADATA = 8
MAX_METADATA_BYTES = 16_384
_CONTROL = re.compile(rb"[\x00-\x1f\x7f]")
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class _Refused(ValueError):
    pass


def _invalid(message: str) -> ApiError:
    return ApiError(422, "invalid_request", message)


def _constant(name: str) -> Any:
    raise _Refused(f"{name} is not a JSON number: numbers must be finite")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"the number {text[:40]} is out of range: numbers must be finite")
    return value


def _children(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield item
    elif isinstance(value, list):
        yield from value


def _depth_and_nul(root: Any, limit: int, where: str) -> None:
    """Walk without recursion: nesting over ``limit``, or NUL in a string, is refused."""
    stack: list[tuple[Any, int]] = [(root, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            if NUL in value:
                raise _Refused(f"{where} holds a NUL character")
            continue
        if not isinstance(value, dict | list):
            continue
        if depth > limit:
            raise _Refused(f"{where} is nested deeper than {limit} levels")
        stack.extend((child, depth + 1) for child in _children(value))


def _check_metadata(doc: Any) -> None:
    meta = doc.get("metadata") if isinstance(doc, dict) else None
    if not isinstance(meta, dict | list):
        return
    _depth_and_nul(meta, MAX_DEPTH_METADATA, "metadata")
    size = len(json.dumps(meta, ensure_ascii=False).encode())
    if size > MAX_METADATA_BYTES:
        raise _Refused(f"metadata is {size} bytes as JSON; at most {MAX_METADATA_BYTES}")


def check_json(raw: bytes) -> None:
    """``_Refused`` (a ValueError) for a hostile JSON document; malformed JSON is left to
    the route, which answers it in its own words."""
    try:
        doc = json.loads(raw, parse_constant=_constant, parse_float=_finite, parse_int=_integer)
    except RecursionError:
        raise _Refused(f"the body is nested deeper than {MAX_DEPTH} levels") from None
    except _Refused:
        raise
    except ValueError:
        return  # not JSON (or not UTF-8): the route's own validation says so
    _depth_and_nul(doc, MAX_DEPTH, "the body")
    _check_metadata(doc)


def _integer(text: str) -> int:
    if len(text) > 40:  # beyond any field's range; int() of a huge literal is quadratic
        raise _Refused(f"the number {text[:40]}... is out of range")
    return int(text)


def _check_target(scope: Scope) -> None:
    path = str(scope.get("path", "")).encode("utf-8", "surrogateescape")
    query = unquote_to_bytes(bytes(scope.get("query_string", b"")).decode("latin-1"))
    if _CONTROL.search(path) or _CONTROL.search(query.replace(b"+", b" ")):
        raise _invalid("control characters (NUL...) are not allowed in a path or query")


def _is_json(scope: Scope) -> bool:
    if scope.get("method") not in _BODY_METHODS:
        return False
    ctype = Headers(scope=scope).get("content-type", "")
    return not ctype.startswith("multipart/")


class BodyGuard:
    """See the module doc."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            _check_target(scope)
        except ApiError as exc:
            await error_response(exc)(scope, receive, send)
            return
        if not _is_json(scope):
            await self.app(scope, receive, send)
            return
        try:
            body, more = await _read(receive)  # the body limit may refuse it meanwhile
            check_json(body)
        except ApiError as exc:
            await error_response(exc)(scope, receive, send)
            return
        except _Refused as exc:
            await error_response(_invalid(str(exc)))(scope, receive, send)
            return
        await self.app(scope, _replay(body, more, receive), send)


async def _read(receive: Receive) -> tuple[bytes, bool]:
    """The whole body (the body limit outside bounds it); False if the client went away."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), False
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), True


def _replay(body: bytes, complete: bool, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            if complete:
                return {"type": "http.request", "body": body, "more_body": False}
            return {"type": "http.disconnect"}
        return await receive()

    return replay
