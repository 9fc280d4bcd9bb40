"""SPEC M-9: each call priced on its own, by the tier its input size selects."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from shared.agent.messages import Usage
from shared.agent.pricing import price_call, select_tier
from shared.agent.spec import Pricing, PricingTier

TIERED = Pricing(
    tiers=[
        PricingTier(max_input_tokens=32_000, input=1.0, output=2.0),
        PricingTier(max_input_tokens=128_000, input=3.0, output=6.0, cached_input=0.5),
        PricingTier(max_input_tokens=None, input=10.0, output=20.0),
    ]
)


def test_tier_is_the_first_whose_bound_covers_the_input() -> None:
    # SPEC M-9
    assert select_tier(TIERED, 0) is TIERED.tiers[0]
    assert select_tier(TIERED, 32_000) is TIERED.tiers[0]  # ≥ is inclusive
    assert select_tier(TIERED, 32_001) is TIERED.tiers[1]
    assert select_tier(TIERED, 10**9) is TIERED.tiers[2]


def test_price_of_one_call() -> None:
    # SPEC M-9: in·in/1000 + out·out/1000, the whole call at its tier
    assert price_call(TIERED, Usage(1000, 500), own_key=False) == pytest.approx(1.0 + 1.0)
    assert price_call(TIERED, Usage(40_000, 1000), own_key=False) == pytest.approx(120 + 6)


def test_summing_calls_is_not_pricing_summed_tokens() -> None:
    # SPEC M-9: two 20k calls stay in tier 1; their 40k sum would be tier 2
    per_call = 2 * price_call(TIERED, Usage(20_000, 0), own_key=False)
    assert per_call == pytest.approx(40.0)
    assert price_call(TIERED, Usage(40_000, 0), own_key=False) == pytest.approx(120.0)


def test_cached_input_price_replaces_the_input_price_for_cached_tokens() -> None:
    # SPEC M-9: cached-input price where given
    usage = Usage(input_tokens=50_000, output_tokens=0, cached_input_tokens=20_000)
    assert price_call(TIERED, usage, own_key=False) == pytest.approx(
        (30_000 * 3 + 20_000 * 0.5) / 1000
    )


def test_cached_tokens_without_a_cached_price_are_billed_as_input() -> None:
    usage = Usage(input_tokens=1000, output_tokens=0, cached_input_tokens=600)
    assert price_call(TIERED, usage, own_key=False) == pytest.approx(1.0)


def test_cached_tokens_never_exceed_the_input() -> None:
    usage = Usage(input_tokens=40_000, output_tokens=0, cached_input_tokens=90_000)
    assert price_call(TIERED, usage, own_key=False) == pytest.approx(40_000 * 0.5 / 1000)


def test_own_key_costs_nothing() -> None:
    # SPEC M-9
    assert price_call(TIERED, Usage(10**6, 10**6), own_key=True) == 0.0


def test_no_tiers_is_free_and_bounded_tiers_fall_back_to_the_last() -> None:
    assert price_call(Pricing(), Usage(100, 100), own_key=False) == 0.0
    bounded = Pricing(tiers=[PricingTier(max_input_tokens=10, input=1.0, output=1.0)])
    assert price_call(bounded, Usage(1000, 0), own_key=False) == pytest.approx(1.0)


def test_estimated_usage_is_priced_too() -> None:
    usage = Usage(1000, 1000, estimated=True)
    assert price_call(TIERED, usage, own_key=False) == pytest.approx(3.0)


def test_pricing_module_is_pure() -> None:
    # shared/agent is the pure core: importing pricing pulls in no I/O library
    code = (
        "import sys, shared.agent.pricing; "
        "bad = [m for m in ('httpx', 'celery', 'sqlalchemy', 'redis') if m in sys.modules]; "
        "print(','.join(bad))"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root
    )
    assert out.stdout.strip() == ""
