"""One trace per run through real workers: the API request (the SDK's in-memory exporter in
this process), then every round, model call and tool task on two worker processes (exported
over OTLP/HTTP to a receiver here): api → round × 3 → model, tool."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from scheduler.app import create_app
from shared import tracing
from shared.engine.runtime import Runtime
from tests.otlp_receiver import OtlpReceiver
from tests.support import WorkerProcs, wait_for

pytestmark = pytest.mark.services

REPLIES = [
    {"tool_calls": [{"id": "c1", "name": "echo", "arguments": {"text": "one"}}]},
    {"tool_calls": [{"id": "c2", "name": "echo", "arguments": {"text": "two"}}]},
    {"text": "Echoed one and two."},
]


@pytest.fixture
def api_spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_provider(provider)
    yield exporter
    tracing.use_provider(None)


@pytest.fixture
def otlp() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as receiver:
        yield receiver


def _worker_spans(otlp: OtlpReceiver) -> list[dict[str, Any]]:
    def ready() -> bool:
        names = [s["name"] for s in otlp.spans]
        committed = [
            s
            for s in otlp.spans
            if s["name"] == "treadle.round"
            and s["attributes"].get("treadle.outcome") == "committed"
        ]
        # A parent span ends after its children, so it can reach the receiver in a later
        # batch: wait for the tool tasks' own spans as well as the calls under them.
        tools = names.count("treadle.tool") == 2 and names.count("execute_tool echo") == 2
        return len(committed) == 3 and tools

    wait_for(ready, 60, what="the workers' spans")
    return list(otlp.spans)


def test_one_trace_per_run_across_two_workers(
    prod_rt: Runtime,
    workers: WorkerProcs,
    otlp: OtlpReceiver,
    api_spans: InMemorySpanExporter,
) -> None:
    workers.env.update(
        {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            "OTEL_SERVICE_NAME": "treadle-worker",
        }
    )
    workers.start("alpha", concurrency=2)
    workers.start("beta", concurrency=2)
    agent = {
        "kind": "agent",
        "model": {"provider": "scripted", "replies": REPLIES},
        "tools": ["echo"],
    }
    with TestClient(create_app(lambda: prod_rt)) as client:
        run = client.post("/v1/runs", json={"agent": agent, "input": "echo twice"}).json()
        wait_for(
            lambda: client.get(f"/v1/runs/{run['id']}").json()["status"] == "completed",
            60,
            what="the run completed",
        )
    spans = _worker_spans(otlp)

    api = next(s for s in api_spans.get_finished_spans() if s.name == "POST /v1/runs")
    trace_id = format(api.context.trace_id, "032x")
    api_id = format(api.context.span_id, "016x")
    assert {s["trace_id"] for s in spans} == {trace_id}, "one trace for the whole run"
    assert {s["service"] for s in spans} == {"treadle-worker"}

    children: dict[str | None, list[dict[str, Any]]] = {}
    for s in spans:
        children.setdefault(s["parent_id"], []).append(s)
    rounds = [
        s
        for s in children[api_id]
        if s["name"] == "treadle.round" and s["attributes"]["treadle.outcome"] == "committed"
    ]
    assert len(rounds) == 3
    tools = 0
    for r in rounds:
        under = {s["name"]: s for s in children.get(r["span_id"], [])}
        model = under["chat inline"]
        attrs = model["attributes"]
        assert attrs["gen_ai.operation.name"] == "chat"
        assert attrs["gen_ai.request.model"] == "inline"
        assert attrs["gen_ai.usage.input_tokens"] > 0
        assert attrs["gen_ai.usage.output_tokens"] > 0
        assert attrs["gen_ai.response.finish_reasons"] in (["tool_calls"], ["stop"])
        if "treadle.tool" in under:
            tools += 1
            tool = under["treadle.tool"]
            executed = children[tool["span_id"]]
            assert [e["name"] for e in executed] == ["execute_tool echo"]
            assert executed[0]["attributes"]["gen_ai.tool.name"] == "echo"
    assert tools == 2
