"""The limits every new run passes, however it comes — a submission over the API or a cron's
fire: the tenant's runs in flight (``TREADLE_MAX_RUNS_IN_FLIGHT``) and the submissions per
minute of the key that asked (``TREADLE_SUBMITS_PER_MINUTE``; a cron's are its creator's).
Each check returns why a run may not start now (a ``Refusal``), or None; the API answers a
refusal with its status, a cron skips the slot.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from shared.engine.runtime import Runtime
from shared.llm.ratelimit import Limits
from shared.store import admission as store
from shared.store.db import reading

__all__ = ["IN_FLIGHT_RETRY_S", "Refusal", "in_flight", "rate"]

log = logging.getLogger("treadle.api")
IN_FLIGHT_RETRY_S = 5.0


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a new run may not start now: an HTTP status and error code, a message, when to
    try again."""

    status: int
    code: str
    message: str
    retry_after: float


def in_flight(rt: Runtime, tenant: str) -> Refusal | None:
    """The tenant already has its limit of runs in flight."""
    limit = rt.settings.max_runs_in_flight
    if limit <= 0:
        return None
    with reading(rt.engine) as conn:
        n = store.open_runs(conn, tenant)
    if n < limit:
        return None
    return Refusal(
        429,
        "too_many_runs",
        f"{n} runs in flight for this tenant (scheduled, queued, running or waiting); "
        f"the limit is {limit}",
        IN_FLIGHT_RETRY_S,
    )


def rate(rt: Runtime, key: str) -> Refusal | None:
    """The key made ``TREADLE_SUBMITS_PER_MINUTE`` submissions within the last minute (Redis
    when the runtime's limiter is shared, else in this process). The limiter unreachable:
    admitted (a warning logged), or a 503 refusal when ``TREADLE_LIMITER_ON_FAILURE=closed``."""
    per_minute = rt.settings.submits_per_minute
    if per_minute <= 0:
        return None
    try:
        permit = rt.limiter.acquire(
            f"api:submit:{key}", Limits(requests_per_minute=per_minute), 1, 60.0
        )
    except Exception as exc:  # Redis unreachable: TREADLE_LIMITER_ON_FAILURE decides
        if rt.settings.limiter_on_failure == "closed":
            message = "the submission limiter is unavailable; try again shortly"
            return Refusal(503, "unavailable", message, 5.0)
        log.warning("submit limiter unavailable (%s); admitting without it", exc)
        return None
    if permit.granted:
        return None
    message = f"over {per_minute} run submissions a minute for this API key"
    return Refusal(429, "rate_limited", message, permit.wait)
