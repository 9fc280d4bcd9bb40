"""Prometheus metrics. Workers count what they do; the API also reports gauges read from the
database and the broker at scrape time. Set ``PROMETHEUS_MULTIPROC_DIR`` for prefork pools
(prometheus-client's multiprocess mode); a threads-pool worker is one process."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = [
    "CONTENT_TYPE_LATEST",
    "MODEL_COST",
    "MODEL_TOKENS",
    "REAPER",
    "RETRIES",
    "ROUNDS",
    "ROUND_SECONDS",
    "TOOL_SECONDS",
    "StateCollector",
    "render",
]

_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

ROUNDS = Counter("treadle_rounds", "Round tasks by outcome", ["kind", "outcome"])
ROUND_SECONDS = Histogram(
    "treadle_round_seconds", "Round latency by phase", ["phase"], buckets=_BUCKETS
)
TOOL_SECONDS = Histogram("treadle_tool_seconds", "Tool call latency", ["tool"], buckets=_BUCKETS)
MODEL_TOKENS = Counter("treadle_model_tokens", "Model tokens", ["profile", "direction"])
MODEL_COST = Counter("treadle_model_cost", "Model cost (profile currency units)", ["profile"])
RETRIES = Counter("treadle_retries", "Retries by cause", ["cause"])
REAPER = Counter("treadle_reaper_redrives", "Reaper re-drives", ["what"])


class StateCollector(Collector):
    """Gauges read at scrape time: runs by status (waiting included) and queue depth."""

    def __init__(
        self,
        runs_by_status: Callable[[], dict[str, int]],
        queue_depth: Callable[[], dict[str, int]],
    ) -> None:
        self._runs = runs_by_status
        self._queues = queue_depth

    def collect(self) -> Iterator[Any]:
        runs = GaugeMetricFamily("treadle_runs", "Runs by status", labels=["status"])
        for status, n in sorted(_safe(self._runs).items()):
            runs.add_metric([status], n)
        yield runs
        waiting = GaugeMetricFamily("treadle_waiting_runs", "Runs waiting for a person")
        waiting.add_metric([], _safe(self._runs).get("waiting", 0))
        yield waiting
        depth = GaugeMetricFamily(
            "treadle_queue_depth", "Messages in broker queues", labels=["queue"]
        )
        for queue, n in sorted(_safe(self._queues).items()):
            depth.add_metric([queue], n)
        yield depth


def _safe(fn: Callable[[], dict[str, int]]) -> dict[str, int]:
    try:
        return fn()
    except Exception:
        return {}


def render(extra: Collector | None = None) -> bytes:
    """The exposition text: this process (or every process, in multiprocess mode) + extra."""
    registry = CollectorRegistry()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    else:
        from prometheus_client import REGISTRY

        for collector in list(REGISTRY._collector_to_names):
            registry.register(collector)
    if extra is not None:
        registry.register(extra)
    return bytes(generate_latest(registry))
