"""One time format for everything treadle shows: ISO 8601 in UTC, ``2026-01-02T03:04:05.678Z``.

The database keeps epoch seconds (floats: cheap to compare and to add a timeout to); the views
(the HTTP API, SSE, webhook bodies, the CLI) convert at the edge. Epoch stays only where a
standard asks for it: the Standard Webhooks ``webhook-timestamp`` header and OpenAI's objects.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

__all__ = ["TIME_KEYS", "epoch", "is_time_key", "iso", "iso_or_none", "iso_times"]

TIME_KEYS = frozenset({"at", "since"})
"""Keys of stored documents that hold a time without the ``_at`` suffix: a decision's or a
posted message's ``at``, an outage's ``since``."""


def iso(ts: float) -> str:
    """Epoch seconds as ISO 8601 UTC with a ``Z``."""
    return datetime.fromtimestamp(ts, tz=UTC).isoformat().replace("+00:00", "Z")


def iso_or_none(ts: float | None) -> str | None:
    return None if ts is None else iso(ts)


def epoch(value: str) -> float:
    """An ISO 8601 time (as ``iso`` writes it) back to epoch seconds (durations, ages)."""
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def is_time_key(key: object) -> bool:
    """Does a stored document's key name a time (``*_at``, ``at``, ``since``)?"""
    return isinstance(key, str) and (key.endswith("_at") or key in TIME_KEYS)


def _is_time(key: object, value: object) -> bool:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return number and is_time_key(key)


def iso_times(value: Any) -> Any:
    """A copy of a JSON-like value with every number under a key naming a time (``asked_at``,
    ``expires_at``..., ``at``, ``since``: ``is_time_key``) as ISO 8601: stored documents (a
    run's ``pending``, an event's data) keep epoch seconds; what is shown of them does not."""
    if isinstance(value, Mapping):
        return {k: iso(v) if _is_time(k, v) else iso_times(v) for k, v in value.items()}
    if isinstance(value, list):
        return [iso_times(v) for v in value]
    return value
