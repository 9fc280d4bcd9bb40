"""The cost of one model call (SPEC M-9). Pure: no I/O imports.

Each call is priced on its own and the costs are summed by the caller: the tier depends on
the call's own input size, so pricing summed tokens would be wrong. Prices are per 1000
tokens.
"""

from __future__ import annotations

from typing import Any

from shared.agent.messages import Reply, Usage
from shared.agent.spec import ModelProfile, Pricing, PricingTier

__all__ = ["call_usage", "price_call", "select_tier"]


def select_tier(pricing: Pricing, input_tokens: int) -> PricingTier | None:
    """The first tier whose ``max_input_tokens`` (None = unbounded) is ≥ ``input_tokens``.

    When every tier is bounded and the call is larger than all of them, the last tier applies
    (FastGPT's open-ended last tier); no tiers at all → ``None`` (free).
    """
    for tier in pricing.tiers:
        if tier.max_input_tokens is None or tier.max_input_tokens >= input_tokens:
            return tier
    return pricing.tiers[-1] if pricing.tiers else None


def price_call(pricing: Pricing, usage: Usage, own_key: bool) -> float:
    """``in_price·in/1000 + out_price·out/1000``; cached input tokens are billed at the
    tier's ``cached_input`` price instead of the input price, and reasoning tokens (a part of
    the output) at its ``reasoning`` price instead of the output price, when those prices are
    given. A profile with ``own_key`` costs 0."""
    if own_key:
        return 0.0
    tier = select_tier(pricing, usage.input_tokens)
    if tier is None:
        return 0.0
    cached = 0
    if tier.cached_input is not None:
        cached = min(max(usage.cached_input_tokens, 0), usage.input_tokens)
    uncached = usage.input_tokens - cached
    reasoning = 0
    if tier.reasoning is not None:
        reasoning = min(max(usage.reasoning_tokens, 0), usage.output_tokens)
    cost = uncached * tier.input + (usage.output_tokens - reasoning) * tier.output
    if tier.cached_input is not None:
        cost += cached * tier.cached_input
    if tier.reasoning is not None:
        cost += reasoning * tier.reasoning
    return cost / 1000.0


def call_usage(reply: Reply, profile: ModelProfile, cost: float, latency_ms: int) -> dict[str, Any]:
    """The usage record of one model call: its tokens (none reported: zeros, marked
    estimated), its cost and latency, and the model that answered."""
    u = reply.usage
    return {
        "input_tokens": u.input_tokens if u else 0,
        "output_tokens": u.output_tokens if u else 0,
        "cached_input_tokens": u.cached_input_tokens if u else 0,
        "reasoning_tokens": u.reasoning_tokens if u else 0,
        "estimated": u.estimated if u else True,
        "cost": cost,
        "latency_ms": latency_ms,
        "committed": True,
        "model": reply.raw_model or profile.model or profile.name,
    }
