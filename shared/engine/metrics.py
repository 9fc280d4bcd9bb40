"""Prometheus metrics. Workers count what they do; the API also reports gauges read from the
database and the broker at scrape time. Set ``PROMETHEUS_MULTIPROC_DIR`` for prefork pools
(prometheus-client's multiprocess mode); a threads-pool worker is one process."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = [
    "CONTENT_TYPE_LATEST",
    "GATE_WAIT",
    "LIVE_DROPPED",
    "MODEL_COST",
    "MODEL_TOKENS",
    "REAPER",
    "RETRIES",
    "ROUNDS",
    "STALE",
    "TAKEOVERS",
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
GATE_WAIT = Histogram(
    "treadle_engine_gate_wait_seconds",
    "Time a worker thread waited for the engine gate, by the stage it came in for",
    ["stage"],
    buckets=_BUCKETS,
)
TOOL_SECONDS = Histogram("treadle_tool_seconds", "Tool call latency", ["tool"], buckets=_BUCKETS)
MODEL_TOKENS = Counter("treadle_model_tokens", "Model tokens", ["profile", "direction"])
MODEL_COST = Counter("treadle_model_cost", "Model cost (profile currency units)", ["profile"])
RETRIES = Counter("treadle_retries", "Retries by cause", ["cause"])
LIVE_DROPPED = Counter(
    "treadle_live_dropped", "Live messages (wake-ups, deltas) dropped: the sender's queue was full"
)
REAPER = Counter("treadle_reaper_redrives", "Reaper re-drives", ["what"])
MCP_UNAVAILABLE = Counter(
    "treadle_mcp_unavailable",
    "MCP servers whose tools a run's catalog lacks (unreachable, slow to list, refused)",
)
TAKEOVERS = Counter(
    "treadle_takeovers", "Rounds and tool calls taken over from a dead worker", ["what"]
)
STALE = Counter(
    "treadle_stale_deliveries",
    "Deliveries with nothing to do (a duplicate, a stale version, a row held elsewhere)",
    ["reason"],
)


class StateCollector(Collector):
    """Gauges read at scrape time: runs by status (waiting included), by tenant and status,
    and queue depth. Run counts are left out when their callables are None (a scrape without
    an admin key: tenants do not learn each other's activity)."""

    def __init__(
        self,
        runs_by_status: Callable[[], dict[str, int]] | None,
        queue_depth: Callable[[], dict[str, int]],
        runs_by_tenant: Callable[[], dict[tuple[str, str], int]] | None = None,
        spend: Callable[[], dict[tuple[str, str], float]] | None = None,
    ) -> None:
        self._runs = runs_by_status
        self._queues = queue_depth
        self._tenants = runs_by_tenant
        self._spend = spend

    def collect(self) -> Iterator[Any]:
        if self._runs is not None:
            yield from self._run_counts(self._runs)
        if self._tenants is not None:
            family = GaugeMetricFamily(
                "treadle_tenant_runs", "Runs by tenant and status", labels=["tenant", "status"]
            )
            for (tenant, status), n in sorted(_safe(self._tenants).items()):
                family.add_metric([tenant, status], n)
            yield family
        if self._spend is not None:
            family = GaugeMetricFamily(
                "treadle_spend",
                "Spend envelopes summed per scope: spent, reserved (calls in flight) and cap",
                labels=["scope", "kind"],
            )
            for (scope, kind), value in sorted(_safe(self._spend).items()):
                family.add_metric([scope, kind], value)
            yield family
        depth = GaugeMetricFamily(
            "treadle_queue_depth", "Messages in broker queues", labels=["queue"]
        )
        for queue, n in sorted(_safe(self._queues).items()):
            depth.add_metric([queue], n)
        yield depth

    @staticmethod
    def _run_counts(fn: Callable[[], dict[str, int]]) -> Iterator[Any]:
        counts = _safe(fn)
        runs = GaugeMetricFamily("treadle_runs", "Runs by status", labels=["status"])
        for status, n in sorted(counts.items()):
            runs.add_metric([status], n)
        yield runs
        waiting = GaugeMetricFamily("treadle_waiting_runs", "Runs waiting for a person")
        waiting.add_metric([], counts.get("waiting", 0))
        yield waiting


K = TypeVar("K")


def _safe(fn: Callable[[], dict[K, Any]]) -> dict[K, Any]:
    try:
        return fn()
    except Exception:
        return {}


def render(extra: Collector | None = None) -> bytes:
    """The exposition text: this process (or every process, in multiprocess mode) + extra."""
    registry = CollectorRegistry()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    else:
        for collector in list(REGISTRY._collector_to_names):
            registry.register(collector)
    if extra is not None:
        registry.register(extra)
    return bytes(generate_latest(registry))
