"""Tracing without workers: off by default (no-ops), the OTEL_* switch, the run's stored
context, which context each dispatch carries, and a task's parent."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from scheduler.app import create_app
from shared import tracing
from shared.agent.spec import ModelProfile
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.llm.profiles import make_model
from shared.store import runs as run_store


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_provider(provider)
    yield exporter
    tracing.use_provider(None)
    tracing.use_root_loader(lambda _: None)


def _hex(span_id: int, width: int = 16) -> str:
    return format(span_id, f"0{width}x")


def test_off_by_default_everything_is_a_no_op() -> None:
    assert not tracing.enabled()
    assert not tracing.configure("t", env={})
    profile = ModelProfile(provider="demo")
    model = make_model(profile)
    assert type(model).__name__ == "DemoModel"  # not wrapped
    assert tracing.dispatch_headers("round", "run_x") is None
    assert tracing.carrier() is None
    with tracing.task_span("treadle.round", SimpleNamespace(), "run_x") as span:
        span.set_attribute("treadle.outcome", "committed")


@pytest.mark.parametrize(
    ("env", "wanted"),
    [
        ({}, False),
        ({"OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}, False),
    ],
)
def test_the_otel_variables_switch_it_on(env: dict[str, str], wanted: bool) -> None:
    assert tracing._wanted(env) is wanted


def test_the_run_stores_the_requests_context(
    sqlite_rt: Runtime, spans: InMemorySpanExporter
) -> None:
    with TestClient(create_app(lambda: sqlite_rt)) as client:
        run = client.post("/v1/runs", json={"agent": "demo", "input": "hi"}).json()
    api = next(s for s in spans.get_finished_spans() if s.name == "POST /v1/runs")
    with sqlite_rt.engine.connect() as conn:
        stored = run_store.run_trace(conn, run["id"])
    assert stored is not None
    _, trace_id, span_id, _ = stored["traceparent"].split("-")
    assert (trace_id, span_id) == (_hex(api.context.trace_id, 32), _hex(api.context.span_id))


def test_model_calls_are_genai_spans(
    sqlite_rt: Runtime, stub: StubBroker, spans: InMemorySpanExporter
) -> None:
    from tests.engine.helpers import agent, submit

    submit(sqlite_rt, agent([{"text": "Hi there."}]))
    stub.drain(sqlite_rt)
    chat = next(s for s in spans.get_finished_spans() if s.name == "chat inline")
    attrs = dict(chat.attributes or {})
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.provider.name"] == "scripted"
    assert attrs["gen_ai.response.finish_reasons"] == ("stop",)
    assert attrs["gen_ai.usage.input_tokens"] > 0 and attrs["gen_ai.usage.output_tokens"] > 0


def test_each_dispatch_carries_the_right_context(spans: InMemorySpanExporter) -> None:
    tracer = TracerProvider().get_tracer("t")
    with tracer.start_as_current_span("api") as api:
        root = tracing.stamp_run("run_1")
    assert root is not None
    root_tp = root["traceparent"]
    assert tracing.dispatch_headers("round", "run_1") == {
        "traceparent": root_tp,
        "treadle-root": root_tp,
    }
    with tracing.task_span("treadle.round", SimpleNamespace(**root), "run_1") as rnd:
        tool = tracing.dispatch_headers("tool", "run_1")
        assert tool is not None and tool["traceparent"].split("-")[2] == _hex(
            rnd.get_span_context().span_id
        )  # a tool call: a child of its round
        nxt = tracing.dispatch_headers("round", "run_1")
        assert nxt is not None and nxt["traceparent"] == root_tp  # a round: of the run
    with tracer.start_as_current_span("another request"):  # an approval, in its own trace
        approved = tracing.dispatch_headers("tool", "run_1")
        assert approved is not None and approved["traceparent"] == root_tp
    assert api.get_span_context().trace_id == rnd.get_span_context().trace_id


def test_a_dispatch_without_headers_joins_the_stored_context(
    spans: InMemorySpanExporter,
) -> None:
    tracer = TracerProvider().get_tracer("t")
    with tracer.start_as_current_span("api") as api:
        stored = tracing.carrier()
    tracing.use_root_loader(lambda run_id: stored if run_id == "run_2" else None)
    assert tracing.dispatch_headers("round", "run_2") is not None  # the reaper's re-send
    with tracing.task_span("treadle.round", SimpleNamespace(), "run_2"):
        pass
    span = next(s for s in spans.get_finished_spans() if s.name == "treadle.round")
    assert span.parent is not None and span.parent.span_id == api.get_span_context().span_id
    assert dict(span.attributes or {})["treadle.run_id"] == "run_2"


def test_a_clients_trace_context_is_joined_only_with_the_trace_scope(
    sqlite_rt: Runtime, spans: InMemorySpanExporter
) -> None:
    """A tenant's ``traceparent`` is not adopted (nor stored with its run): the
    request starts a trace of its own and keeps the client's header as an attribute. A key
    with the ``trace`` scope (the operator's own systems) joins the client's trace."""
    from shared.store import keys

    secure = Runtime(
        engine=sqlite_rt.engine,
        settings=sqlite_rt.settings.model_copy(update={"auth": "required"}),
        publish=sqlite_rt.publish,
    )
    with secure.engine.begin() as conn:
        plain = keys.create_key(conn, "acme").secret
        traced = keys.create_key(conn, "ops", [*keys.DEFAULT_SCOPES, keys.TRACE]).secret
    client_trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    parent = f"00-{client_trace}-00f067aa0ba902b7-01"
    stored = {}
    with TestClient(create_app(lambda: secure)) as client:
        for who, key in (("plain", plain), ("traced", traced)):
            headers = {"Authorization": f"Bearer {key}", "traceparent": parent, "tracestate": "a=b"}
            made = client.post("/v1/runs", json={"agent": "demo", "input": "hi"}, headers=headers)
            assert made.status_code == 201, made.text
            with secure.engine.connect() as conn:
                stored[who] = run_store.run_trace(conn, made.json()["id"])
    api = [s for s in spans.get_finished_spans() if s.name == "POST /v1/runs"]
    assert len(api) == 2
    own, joined = api
    assert _hex(own.context.trace_id, 32) != client_trace
    assert own.attributes is not None
    assert own.attributes["treadle.client.traceparent"] == parent
    assert stored["plain"] is not None and client_trace not in stored["plain"]["traceparent"]
    assert "tracestate" not in stored["plain"]
    assert _hex(joined.context.trace_id, 32) == client_trace
    assert stored["traced"] is not None and client_trace in stored["traced"]["traceparent"]
