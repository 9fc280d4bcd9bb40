"""What a model call may cost at most, and the periods spend envelopes count in (pure).

A call is reserved at its worst case before it is sent (``worst_case``) and settled to its
real cost after: its input is known before sending — counted as twice the project's estimate
(``shared.agent.tokens``: 4 characters a token, a CJK character one), more than a provider's
tokenizer makes of text (2 to 4.5 characters a token; 1 to 1.5 a CJK character) — and its
output is at most its ``max_tokens``, at the dearer of the output and reasoning prices of the
tier the input falls in. So a cap checked against spent + reserved is not overshot by a call
in flight.
"""

from __future__ import annotations

import calendar
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal
from zoneinfo import ZoneInfo

from shared.agent.spec import Pricing

__all__ = [
    "INPUT_MARGIN",
    "PER_MESSAGE_TOKENS",
    "Period",
    "Window",
    "affordable_max_tokens",
    "input_bound",
    "period_window",
    "worst_case",
]

Period = Literal["day", "month"]
PER_MESSAGE_TOKENS = 8  # the wire format's tokens around each message (role, separators)
INPUT_MARGIN = 2  # the bound is this many times the estimate


def input_bound(estimate: int, messages: int) -> int:
    """The most tokens a request estimated at ``estimate`` tokens in ``messages`` messages
    can be counted as by a provider."""
    return INPUT_MARGIN * max(0, estimate) + PER_MESSAGE_TOKENS * max(0, messages)


def _reachable(pricing: Pricing, input_tokens: int) -> list[tuple[float, float]]:
    """(input cost, output price per token) of each tier a call of at most ``input_tokens``
    may be priced in: its real input may fall in any tier up to the bound's."""
    out: list[tuple[float, float]] = []
    for tier in pricing.tiers:
        top = (
            input_tokens
            if tier.max_input_tokens is None
            else min(input_tokens, tier.max_input_tokens)
        )
        reasoning = tier.reasoning if tier.reasoning is not None else 0.0
        out.append((top * tier.input / 1000.0, max(tier.output, reasoning) / 1000.0))
        if tier.max_input_tokens is None or tier.max_input_tokens >= input_tokens:
            break
    return out


def worst_case(pricing: Pricing, input_tokens: int, max_tokens: int, own_key: bool) -> float:
    """The most a call of at most ``input_tokens`` (uncached) and at most ``max_tokens`` of
    output can cost, whichever tier its real input falls in."""
    if own_key or not pricing.tiers:
        return 0.0
    return max(cost_in + max_tokens * out for cost_in, out in _reachable(pricing, input_tokens))


def affordable_max_tokens(
    pricing: Pricing, input_tokens: int, max_tokens: int, left: float, own_key: bool
) -> int:
    """The largest ``max_tokens`` (at most the given one) whose worst case fits in ``left``;
    0 when not even the input fits."""
    if worst_case(pricing, input_tokens, max_tokens, own_key) <= left:
        return max_tokens
    fits = max_tokens
    for cost_in, out in _reachable(pricing, input_tokens):
        room = left - cost_in
        if room < 0:
            return 0
        if out > 0:
            fits = min(fits, int(room / out))
    return max(0, fits)


@dataclass(frozen=True, slots=True)
class Window:
    """The current period of an envelope: from ``start`` to ``end`` (epoch seconds)."""

    start: float
    end: float


def period_window(ts: float, period: Period, timezone: str) -> Window:
    """The day or calendar month that holds ``ts`` in ``timezone``."""
    zone = ZoneInfo(timezone)
    local = datetime.fromtimestamp(ts, tz=UTC).astimezone(zone)
    if period == "day":
        start = local.replace(hour=0, minute=0, second=0, microsecond=0)
        days = 1
    else:
        start = local.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        days = calendar.monthrange(start.year, start.month)[1]
    end = _add_days(start, days, zone)
    return Window(start.timestamp(), end.timestamp())


def _add_days(start: datetime, days: int, zone: ZoneInfo) -> datetime:
    """Midnight ``days`` calendar days after ``start`` (a DST change keeps it at midnight)."""
    naive = start.replace(tzinfo=None)
    ordinal = naive.toordinal() + days
    nxt = datetime.fromordinal(ordinal)
    return nxt.replace(tzinfo=zone)
