"""Limits on what a caller may send (issue #11): body size, input length, tools per spec,
runs in flight per tenant, submissions per minute per key. Over a limit: 413 (too large) or
429 (too many, with ``Retry-After``), and nothing is written.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from scheduler.auth import Caller
from scheduler.errors import ApiError, error_response
from scheduler.spec_policy import check_submitted_spec
from shared.agent.spec import AgentSpec, WebhookSpec
from shared.config import Settings
from shared.engine.runtime import Runtime
from shared.llm.ratelimit import Limits
from shared.store.tables import runs

__all__ = [
    "BODY_LIMIT",
    "BodyLimit",
    "admit",
    "check_in_flight",
    "check_rate",
    "check_size",
]

BODY_LIMIT = 2_000_000
IN_FLIGHT = ("queued", "running", "waiting")
IN_FLIGHT_RETRY_S = 5


def too_large(message: str) -> ApiError:
    return ApiError(413, "too_large", message)


def too_many(code: str, message: str, retry_after: float) -> ApiError:
    seconds = max(1, math.ceil(retry_after))
    return ApiError(429, code, message, {"Retry-After": str(seconds)})


class BodyLimit:
    """413 for a body over the limit of its path: at once from ``Content-Length``, else (a
    chunked body) as soon as the bytes read so far pass it."""

    def __init__(self, app: ASGIApp, limit_for: Callable[[str], tuple[int, str]]) -> None:
        self.app, self.limit_for = app, limit_for

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, message = self.limit_for(str(scope.get("path", "")))
        length = Headers(scope=scope).get("content-length", "")
        if length.isdigit() and int(length) > limit:
            await error_response(too_large(message))(scope, receive, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > limit:
                    raise too_large(message)
            return msg

        await self.app(scope, counted, send)


def _input_chars(value: str | list[dict[str, Any]]) -> int:
    if isinstance(value, str):
        return len(value)
    contents = (m.get("content") for m in value)
    return sum(len(c) if isinstance(c, str) else len(str(c)) for c in contents)


def check_size(settings: Settings, spec: AgentSpec, value: str | list[dict[str, Any]]) -> None:
    """Input length and tools per spec (413)."""
    chars = _input_chars(value)
    if chars > settings.max_input_chars:
        raise too_large(f"input of {chars} characters is over the limit of "
                        f"{settings.max_input_chars} (TREADLE_MAX_INPUT_CHARS)")
    if len(spec.tools) > settings.max_tools:
        raise too_large(f"{len(spec.tools)} tools in the agent spec; at most "
                        f"{settings.max_tools} (TREADLE_MAX_TOOLS)")


def check_in_flight(rt: Runtime, tenant: str) -> None:
    """429 when the tenant already has its limit of queued, running and waiting runs (runs
    held behind a busy thread's active run are not counted)."""
    limit = rt.settings.max_runs_in_flight
    if limit <= 0:
        return
    query = sa.select(sa.func.count()).select_from(runs).where(
        runs.c.tenant == tenant, runs.c.status.in_(IN_FLIGHT), runs.c.held.is_(False))
    with rt.engine.connect() as conn:
        n = int(conn.execute(query).scalar_one())
    if n >= limit:
        raise too_many("too_many_runs", f"{n} runs in flight for this tenant (queued, running or "
                       f"waiting); the limit is {limit}", IN_FLIGHT_RETRY_S)


def check_rate(rt: Runtime, key: str) -> None:
    """429 after ``TREADLE_SUBMITS_PER_MINUTE`` submissions by one key within a minute (Redis
    when the runtime's limiter is shared, else in this process)."""
    per_minute = rt.settings.submits_per_minute
    if per_minute <= 0:
        return
    permit = rt.limiter.acquire(f"api:submit:{key}", Limits(requests_per_minute=per_minute),
                                1, 60.0)
    if not permit.granted:
        raise too_many("rate_limited", f"over {per_minute} run submissions a minute for this "
                       "API key", permit.wait)


def admit(
    rt: Runtime, caller: Caller, submitted: AgentSpec | str, spec: AgentSpec,
    value: str | list[dict[str, Any]], webhook: WebhookSpec | None = None,
) -> None:
    """Every check on a new run, before anything is written: sizes (413), what a tenant's spec
    may reach (422, ``scheduler.spec_policy``), submissions per minute and runs in flight (429).
    ``submitted``: the agent as sent (a registered name is not policed), ``spec`` resolved.
    Any route that creates runs for a caller calls this first."""
    check_size(rt.settings, spec, value)
    if caller.key_id is not None:  # a tenant's key (auth required), not the keyless owner
        check_submitted_spec(rt.settings, submitted, webhook)
    check_rate(rt, caller.limit_key)
    check_in_flight(rt, caller.tenant)
