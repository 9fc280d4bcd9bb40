"""Every token priced (docs/cost.md): cached input tokens and reasoning tokens, as the
providers report them in recorded streams, each at its own price in the profile's tier; a
run's ``/usage`` rows carry them."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from shared.agent.messages import Usage
from shared.agent.pricing import price_call
from shared.agent.spec import Pricing

from .helpers import SSE_DIR, SSE_HEADERS, mock_model, request

USAGE_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "usage"
TIER = {"input": 1.0, "cached_input": 0.1, "output": 2.0, "reasoning": 3.0}


def _usage(path: Path) -> Usage:
    body = path.read_bytes()

    def handler(_: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers=SSE_HEADERS)

    reply = mock_model(handler).complete(request())
    assert reply.usage is not None and not reply.usage.estimated
    return reply.usage


@pytest.mark.parametrize(
    ("path", "tokens"),
    [
        (USAGE_DIR / "openai_gpt4o_cached_prompt.txt", (2006, 8, 1920, 0)),
        (USAGE_DIR / "deepseek_reasoner_cache_hit.txt", (1030, 212, 1024, 198)),
        (USAGE_DIR / "anthropic_style_cache_read.txt", (3114, 8, 3000, 0)),
        (SSE_DIR / "deepseek_reasoner_reasoning_content.txt", (6, 212, 0, 198)),
    ],
    ids=lambda v: v.name if isinstance(v, Path) else "",
)
def test_cached_and_reasoning_tokens_are_read_and_priced(
    path: Path, tokens: tuple[int, int, int, int]
) -> None:
    usage = _usage(path)
    got = (usage.input_tokens, usage.output_tokens, usage.cached_input_tokens)
    assert (*got, usage.reasoning_tokens) == tokens
    inputs, outputs, cached, reasoning = tokens
    expected = (
        (inputs - cached) * 1.0 + cached * 0.1 + (outputs - reasoning) * 2.0 + reasoning * 3.0
    )
    pricing = Pricing.model_validate({"tiers": [TIER]})
    assert price_call(pricing, usage, own_key=False) == pytest.approx(expected / 1000)


def test_without_their_own_prices_they_cost_as_input_and_output() -> None:
    usage = Usage(input_tokens=100, output_tokens=50, cached_input_tokens=60, reasoning_tokens=40)
    pricing = Pricing.model_validate({"tiers": [{"input": 1.0, "output": 2.0}]})
    assert price_call(pricing, usage, own_key=False) == pytest.approx((100 + 100) / 1000)
