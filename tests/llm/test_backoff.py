"""SPEC M-8: exponential backoff with jitter that honours Retry-After (seconds or date)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from shared.llm.backoff import backoff_delay, parse_retry_after

NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("33", 33.0), (" 1.5 ", 1.5), ("0", 0.0), ("-4", 0.0)],
)
def test_retry_after_seconds(value: str, seconds: float) -> None:
    # SPEC M-8
    assert parse_retry_after(value, NOW) == seconds


def test_retry_after_http_date() -> None:
    # SPEC M-8: an HTTP date (IMF-fixdate)
    later = format_datetime(NOW + timedelta(seconds=90), usegmt=True)
    assert parse_retry_after(later, NOW) == 90.0
    assert parse_retry_after("Sun, 29 Nov 2026 12:00:30 GMT", NOW) == 30.0


def test_retry_after_date_in_the_past_is_zero() -> None:
    assert parse_retry_after("Sun, 29 Nov 2026 11:00:00 GMT", NOW) == 0.0


@pytest.mark.parametrize("value", [None, "", "soon", "nan", "inf", "Sun, 99 Foo"])
def test_unreadable_retry_after_is_none(value: str | None) -> None:
    assert parse_retry_after(value, NOW) is None


def test_naive_now_is_taken_as_utc() -> None:
    naive = NOW.replace(tzinfo=None)
    assert parse_retry_after("Sun, 29 Nov 2026 12:00:10 GMT", naive) == 10.0


def test_exponential_growth_and_cap() -> None:
    # jitter=1.0 gives the ceiling of each step
    ceilings = [backoff_delay(n, base=1.0, cap=60.0, jitter=1.0) for n in range(9)]
    assert ceilings == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    assert backoff_delay(10_000, jitter=1.0) == 60.0  # no overflow


def test_equal_jitter_bounds() -> None:
    rng = random.Random(7)
    for attempt in range(8):
        ceiling = min(60.0, 2.0**attempt)
        for _ in range(50):
            delay = backoff_delay(attempt, jitter=rng)
            assert ceiling / 2 <= delay <= ceiling
    assert backoff_delay(3, jitter=0.0) == 4.0


def test_jitter_is_seedable() -> None:
    first = [backoff_delay(n, jitter=random.Random(1)) for n in range(5)]
    assert first == [backoff_delay(n, jitter=random.Random(1)) for n in range(5)]


def test_never_less_than_retry_after() -> None:
    # SPEC M-8: honour Retry-After, even past the cap (the caller checks its deadline)
    assert backoff_delay(0, retry_after=33.0, jitter=1.0) == 33.0
    assert backoff_delay(0, cap=10, retry_after=120.0) == 120.0
    assert backoff_delay(6, retry_after=1.0, jitter=1.0) == 60.0


def test_default_jitter_stays_in_bounds() -> None:
    for _ in range(20):
        assert 4.0 <= backoff_delay(3) <= 8.0
