"""Fleet-wide limits per model profile: local and Redis implementations."""

from __future__ import annotations

import time
import uuid

import pytest

from shared.agent.spec import ModelProfile
from shared.llm.ratelimit import (
    DEFAULT_MAX_PAUSE_S,
    Limits,
    LocalLimiter,
    RateLimiter,
    RedisLimiter,
    limit_key,
)
from tests.support import REDIS_BASE, need_service


def _redis() -> RedisLimiter:
    try:
        limiter = RedisLimiter(f"{REDIS_BASE}/0", prefix=f"t{uuid.uuid4().hex[:6]}:")
        limiter._redis.ping()
    except Exception as exc:
        need_service("Redis", exc)
    return limiter


@pytest.fixture(params=["local", "redis"])
def limiter(request: pytest.FixtureRequest) -> RateLimiter:
    return LocalLimiter() if request.param == "local" else _redis()


def test_unlimited_always_grants(limiter: RateLimiter) -> None:
    assert all(limiter.acquire("p", Limits(), 10, 5).granted for _ in range(100))


def test_concurrency_slots(limiter: RateLimiter) -> None:
    lim = Limits(max_concurrent=2)
    a, b = limiter.acquire("p", lim, 1, 30), limiter.acquire("p", lim, 1, 30)
    c = limiter.acquire("p", lim, 1, 30)
    assert a.granted and b.granted and not c.granted and c.wait > 0
    limiter.release(a)
    assert limiter.acquire("p", lim, 1, 30).granted


def test_concurrency_slot_expires_when_its_holder_dies(limiter: RateLimiter) -> None:
    lim = Limits(max_concurrent=1)
    assert limiter.acquire("p", lim, 1, 0.2).granted  # never released: a killed worker
    assert not limiter.acquire("p", lim, 1, 0.2).granted
    time.sleep(0.3)
    assert limiter.acquire("p", lim, 1, 0.2).granted


def test_requests_per_minute(limiter: RateLimiter) -> None:
    lim = Limits(requests_per_minute=3)
    grants = [limiter.acquire("p", lim, 1, 5) for _ in range(4)]
    assert [g.granted for g in grants] == [True, True, True, False]
    assert 50 < grants[-1].wait <= 60


def test_tokens_per_minute(limiter: RateLimiter) -> None:
    lim = Limits(tokens_per_minute=1000)
    assert limiter.acquire("p", lim, 600, 5).granted
    assert not limiter.acquire("p", lim, 600, 5).granted
    assert limiter.acquire("q", lim, 600, 5).granted  # another profile is separate


def test_pause_holds_everyone_off(limiter: RateLimiter) -> None:
    limiter.pause("p", 0.5)
    p = limiter.acquire("p", Limits(max_concurrent=10), 1, 5)
    assert not p.granted and 0.3 < p.wait <= 0.5
    time.sleep(0.55)
    assert limiter.acquire("p", Limits(max_concurrent=10), 1, 5).granted


def test_a_pause_is_capped(limiter: RateLimiter) -> None:
    capped = LocalLimiter(max_pause=0.3) if isinstance(limiter, LocalLimiter) else _redis()
    if isinstance(capped, RedisLimiter):
        capped.max_pause = 0.3
    capped.pause("p", 120)
    assert not capped.acquire("p", Limits(max_concurrent=1), 1, 5).granted
    time.sleep(0.5)
    assert capped.acquire("p", Limits(max_concurrent=1), 1, 5).granted
    assert DEFAULT_MAX_PAUSE_S == 60.0 and LocalLimiter().max_pause == 60.0


def test_inline_profiles_are_limited_per_tenant_and_operator_ones_by_name() -> None:
    inline = ModelProfile(name="gpt", base_url="https://a.example/v1", model="m")
    operator = ModelProfile(name="gpt", base_url="https://a.example/v1", model="m").as_operator()
    assert limit_key(operator, "acme") == limit_key(operator, "globex") == "gpt"
    keys = {limit_key(inline, "acme"), limit_key(inline, "globex"), limit_key(operator, "acme")}
    assert len(keys) == 3
    spoof = ModelProfile.model_validate({"name": "gpt", "base_url": "https://a.example/v1"})
    assert not spoof.operator  # nothing in a submitted spec can claim the operator's trust
