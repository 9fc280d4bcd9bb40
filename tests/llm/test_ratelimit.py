"""Fleet-wide limits per model profile (issue Operations): local and Redis implementations."""

from __future__ import annotations

import time
import uuid

import pytest

from shared.llm.ratelimit import Limits, LocalLimiter, RateLimiter, RedisLimiter
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
