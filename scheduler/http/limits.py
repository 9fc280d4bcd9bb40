"""Limits on what a caller may send: body size, input length, tools per spec,
runs in flight per tenant, submissions per minute per key. Over a limit: 413 (too large) or
429 (too many, with ``Retry-After``), and nothing is written.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from scheduler.http.auth import Caller
from scheduler.http.errors import ApiError, error_response, unavailable
from shared.agent.spec import AgentSpec, WebhookSpec
from shared.config import Settings
from shared.engine import quotas
from shared.engine.runtime import Runtime
from shared.engine.spec_policy import nested_specs, police

__all__ = [
    "BODY_LIMIT",
    "BodyLimit",
    "admit",
    "check_in_flight",
    "check_rate",
    "check_size",
    "police_spec",
]

log = logging.getLogger("treadle.api")
BODY_LIMIT = 2_000_000


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
    """Input length, system prompts included, and tools, sub-agents' included (413)."""
    specs = list(nested_specs(spec))
    chars = _input_chars(value) + sum(len(s.system_prompt) for s in specs)
    if chars > settings.max_input_chars:
        raise too_large(
            f"input of {chars} characters (system prompts included) is over the limit of "
            f"{settings.max_input_chars} (TREADLE_MAX_INPUT_CHARS)"
        )
    tools = sum(len(s.tools) for s in specs)
    if tools > settings.max_tools:
        raise too_large(
            f"{tools} tools in the agent spec (sub-agents included); at most "
            f"{settings.max_tools} (TREADLE_MAX_TOOLS)"
        )


def _raise(refused: quotas.Refusal | None) -> None:
    if refused is None:
        return
    if refused.status == 503:
        raise unavailable(refused.message, max(1, math.ceil(refused.retry_after)))
    raise too_many(refused.code, refused.message, refused.retry_after)


def check_in_flight(rt: Runtime, tenant: str) -> None:
    """429 when the tenant already has its limit of scheduled, queued, running and waiting runs
    (runs held behind a busy thread's active run are not counted; ``shared.engine.quotas``)."""
    _raise(quotas.in_flight(rt, tenant))


def check_rate(rt: Runtime, key: str) -> None:
    """429 after ``TREADLE_SUBMITS_PER_MINUTE`` submissions by one key within a minute; the
    limiter unreachable: admitted, or 503 when ``TREADLE_LIMITER_ON_FAILURE=closed``
    (``shared.engine.quotas``)."""
    _raise(quotas.rate(rt, key))


def police_spec(
    rt: Runtime, caller: Caller, submitted: AgentSpec | str, webhook: WebhookSpec | None = None
) -> None:
    """What a tenant's spec may ask for (``shared.engine.spec_policy``): test models, the
    operator's maxima, operator profile names (422), local processes, env names, private hosts
    and webhook URLs (403). For a run, a saved agent and a resumed run's new spec alike."""
    # keyed: a tenant's key (auth required), not the keyless owner
    police(rt.settings, rt.profiles, submitted, webhook, keyed=caller.key_id is not None)


def admit(
    rt: Runtime,
    caller: Caller,
    submitted: AgentSpec | str,
    spec: AgentSpec,
    value: str | list[dict[str, Any]],
    webhook: WebhookSpec | None = None,
) -> None:
    """Every check on a new run, before anything is written: sizes (413), what a tenant's
    spec may reach (422, ``shared.engine.spec_policy``), submissions per minute and runs in
    flight (429).
    ``submitted``: the agent as sent (a registered name is not policed), ``spec`` resolved.
    Any route that creates runs for a caller calls this first."""
    check_size(rt.settings, spec, value)
    police_spec(rt, caller, submitted, webhook)
    check_rate(rt, caller.limit_key)
    check_in_flight(rt, caller.tenant)
