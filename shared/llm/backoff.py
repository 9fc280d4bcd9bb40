"""Retry timing for transient model errors (SPEC M-8): pure functions, no sleeping.

The model client never retries by itself; the round task catches ``TransientModelError`` and
re-schedules with ``backoff_delay(attempt, retry_after=err.retry_after)``.
"""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

__all__ = ["backoff_delay", "parse_retry_after"]

_MAX_EXPONENT = 62


def parse_retry_after(value: str | None, now: datetime) -> float | None:
    """Seconds to wait from a ``Retry-After`` value: delta-seconds or an HTTP date.

    ``now`` must be timezone-aware (a naive one is taken as UTC). A date in the past gives
    0.0; an unreadable value gives ``None``.
    """
    if value is None:
        return None
    text = value.strip()
    if not text:
        return None
    seconds = _as_seconds(text)
    if seconds is not None:
        return seconds
    return _until_date(text, now)


def _as_seconds(text: str) -> float | None:
    try:
        seconds = float(text)
    except ValueError:
        return None
    if math.isnan(seconds) or math.isinf(seconds):
        return None
    return max(0.0, seconds)


def _until_date(text: str, now: datetime) -> float | None:
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    if now.tzinfo is None:
        now = now.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())


def backoff_delay(
    attempt: int,
    *,
    base: float = 1.0,
    cap: float = 60.0,
    retry_after: float | None = None,
    jitter: random.Random | float | None = None,
) -> float:
    """Seconds to wait before retry number ``attempt`` (0 for the first retry).

    Exponential ``base·2^attempt`` capped at ``cap``, with "equal jitter": the delay lies in
    ``[d/2, d]``. ``jitter`` is a ``random.Random`` to draw from, or a fixed fraction in
    ``[0, 1]`` (deterministic tests); ``None`` uses the module's random source. The result is
    never less than ``retry_after`` (which is not capped: the caller checks its deadline).
    """
    exponent = min(max(attempt, 0), _MAX_EXPONENT)
    ceiling = min(cap, base * 2.0**exponent)
    fraction = _fraction(jitter)
    delay = ceiling / 2 + fraction * ceiling / 2
    if retry_after is not None and retry_after > delay:
        return float(retry_after)
    return delay


def _fraction(jitter: random.Random | float | None) -> float:
    if jitter is None:
        return random.random()
    if isinstance(jitter, random.Random):
        return jitter.random()
    return min(1.0, max(0.0, float(jitter)))
