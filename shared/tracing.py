"""OpenTelemetry traces: one trace per run, from the API request through every round task,
model call, tool task and webhook delivery.

Off by default; on with the standard variables: ``OTEL_TRACES_EXPORTER`` (``otlp``,
``console``, any installed exporter; ``none`` keeps it off) or an OTLP endpoint
(``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, protocol by
``OTEL_EXPORTER_OTLP_PROTOCOL``: ``grpc`` or ``http/protobuf``), ``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_BSP_*``; ``OTEL_SDK_DISABLED=true`` wins. Off, every hook
here is a check of one flag: the OpenTelemetry SDK is not even imported.

How a run's work joins its trace: the API request's span context is stored with the run
(``run_specs.trace``, by ``stamp_run``). A round or a webhook is dispatched with that context
(Celery message headers ``traceparent``/``tracestate``), a tool call with the context of the
round that made it; the header ``treadle-root`` carries the run's context along, so a worker
can dispatch the next round without reading it. A dispatch without headers (the reaper's,
after a crash) reads the stored context: every later dispatch, on any worker, joins the trace.

Spans: the API's (FastAPI instrumentation), ``treadle.round``, ``treadle.tool`` and
``treadle.webhook`` (the tasks), ``chat <model>`` (each model call, GenAI semantic
conventions: ``gen_ai.request.model``, ``gen_ai.usage.input_tokens``/``output_tokens``,
``gen_ai.response.finish_reasons``), ``execute_tool <name>`` (the tool itself).
"""

from __future__ import annotations

import os
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from fastapi import FastAPI
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Tracer

    from shared.agent.spec import ModelProfile
    from shared.llm.base import ChatModel

__all__ = [
    "ROOT_HEADER",
    "carrier",
    "configure",
    "dispatch_headers",
    "enabled",
    "instrument_app",
    "shutdown",
    "stamp_run",
    "task_span",
    "tool_span",
    "traced_model",
    "use_provider",
    "use_root_loader",
]

ROOT_HEADER = "treadle-root"
_TRACE_HEADERS = ("traceparent", "tracestate")
_ROOTS_MAX = 10_000
_lock = threading.Lock()
_tracer: Tracer | None = None
_provider: TracerProvider | None = None
_configured = False
_roots: OrderedDict[str, dict[str, str]] = OrderedDict()
_root_loader: Callable[[str], dict[str, str] | None] | None = None


def _wanted(env: Mapping[str, str]) -> bool:
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def enabled() -> bool:
    return _tracer is not None


def configure(service: str = "treadle", env: Mapping[str, str] | None = None) -> bool:
    """Turn tracing on in this process when the ``OTEL_*`` variables ask for it (once);
    returns whether it is on."""
    global _configured
    env = os.environ if env is None else env
    with _lock:
        if _configured or _tracer is not None:
            return _tracer is not None
        _configured = True
        if not _wanted(env):
            return False
    from opentelemetry import trace
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({SERVICE_NAME: env.get("OTEL_SERVICE_NAME") or service})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(_exporter(env)))
    trace.set_tracer_provider(provider)  # libraries that trace (the mcp SDK) join in
    use_provider(provider)
    return True


def _exporter(env: Mapping[str, str]) -> Any:
    """The span exporter ``OTEL_TRACES_EXPORTER`` names (default ``otlp``), by the SDK's
    entry points; ``otlp`` by its protocol."""
    from importlib.metadata import entry_points

    name = (env.get("OTEL_TRACES_EXPORTER") or "otlp").split(",")[0].strip().lower()
    if name == "otlp":
        protocol = (
            env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
            or "grpc"
        ).strip()
        name = "otlp_proto_http" if protocol.startswith("http") else "otlp_proto_grpc"
    found = entry_points(group="opentelemetry_traces_exporter", name=name)
    if not found:
        raise RuntimeError(f"no OpenTelemetry span exporter named {name!r} is installed")
    return next(iter(found)).load()()


def use_provider(provider: TracerProvider | None) -> None:
    """Trace with ``provider`` in this process (tests; an app that embeds treadle); None
    turns tracing off again."""
    global _tracer, _provider
    _provider = provider
    _tracer = provider.get_tracer("treadle") if provider is not None else None
    with _lock:
        _roots.clear()


def shutdown() -> None:
    """Flush what is buffered (a worker that stops)."""
    if _provider is not None:
        _provider.shutdown()


def instrument_app(
    app: FastAPI, trusted: Callable[[Mapping[str, str]], bool] | None = None
) -> None:
    """Server spans for the API's requests (the FastAPI instrumentation). A request's own
    ``traceparent``/``tracestate`` is joined only when ``trusted(headers)`` says so (a key with
    the ``trace`` scope; None: never): any other request starts a new trace, the client's
    ``traceparent`` kept on its span as ``treadle.client.traceparent``, so a tenant can
    neither graft its runs onto another trace nor plant context in the run's stored trace."""
    if _provider is None:
        return
    import types

    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    FastAPIInstrumentor.instrument_app(
        app,
        tracer_provider=_provider,
        excluded_urls="healthz,metrics",
        server_request_hook=_client_trace_attribute,
    )
    inner = app.build_middleware_stack
    gate = trusted or (lambda _headers: False)

    def build(self: Any) -> Any:
        return _InboundGate(inner(), gate)

    app.build_middleware_stack = types.MethodType(build, app)  # type: ignore[method-assign]


_CLIENT_TRACE = "treadle.client_trace"  # the ASGI scope key for a client's refused context
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")


class _InboundGate:
    """Outside the instrumentation: a request with trace headers from a caller that may not
    set them loses them (the instrumentation then starts a new trace)."""

    def __init__(self, app: Any, trusted: Callable[[Mapping[str, str]], bool]) -> None:
        self.app, self.trusted = app, trusted

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        raw = (scope.get("headers") or []) if scope.get("type") == "http" else []
        names = {k.decode("latin-1").lower() for k, _ in raw}
        if not names & set(_TRACE_HEADERS):
            await self.app(scope, receive, send)
            return
        from starlette.concurrency import run_in_threadpool

        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in raw}
        if await run_in_threadpool(self.trusted, headers):
            await self.app(scope, receive, send)
            return
        kept = [(k, v) for k, v in raw if k.decode("latin-1").lower() not in _TRACE_HEADERS]
        client = headers.get("traceparent", "").strip().lower()
        changed = {**scope, "headers": kept, _CLIENT_TRACE: client}
        await self.app(changed, receive, send)


def _client_trace_attribute(span: Any, scope: Mapping[str, Any]) -> None:
    client = scope.get(_CLIENT_TRACE)
    if client and span is not None and span.is_recording():
        valid = bool(_TRACEPARENT.match(client))
        span.set_attribute("treadle.client.traceparent", client if valid else "(invalid)")


# --- context: captured, stored, carried ------------------------------------------------------


def carrier() -> dict[str, str] | None:
    """The current span context as W3C headers, or None (off, or no span)."""
    if _tracer is None:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    found: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(found)
    return found or None


def stamp_run(run_id: str) -> dict[str, str] | None:
    """The context a new run belongs to (the request's): to store with the run."""
    found = carrier()
    if found is not None:
        _remember(run_id, found)
    return found


def use_root_loader(loader: Callable[[str], dict[str, str] | None]) -> None:
    """How to read a run's stored context (the composition root installs the store's)."""
    global _root_loader
    _root_loader = loader


def _remember(run_id: str, root: Mapping[str, str]) -> None:
    with _lock:
        _roots[run_id] = dict(root)
        _roots.move_to_end(run_id)
        while len(_roots) > _ROOTS_MAX:
            _roots.popitem(last=False)


def _root(run_id: str) -> dict[str, str] | None:
    with _lock:
        found = _roots.get(run_id)
    if found is None and _root_loader is not None:
        found = _root_loader(run_id)
        if found:
            _remember(run_id, found)
    return found


def _in_trace(root: Mapping[str, str] | None) -> bool:
    """Whether the current span belongs to the run's trace (a round's span, not the span of
    an API request that approved the run's writes)."""
    from opentelemetry import trace

    current = trace.get_current_span().get_span_context()
    if not current.is_valid:
        return False
    if root is None:
        return True
    parts = root.get("traceparent", "").split("-")
    return len(parts) > 1 and parts[1] == format(current.trace_id, "032x")


def dispatch_headers(kind: str, run_id: str) -> dict[str, str] | None:
    """The message headers of a dispatch: a tool call is a child of the current span when
    that is in the run's trace (its round), anything else of the run's own context. None
    when off or unknown."""
    if _tracer is None:
        return None
    root = _root(run_id)
    parent = carrier() if kind == "tool" and _in_trace(root) else root
    if parent is None:
        return None
    headers = {k: v for k, v in parent.items() if k in _TRACE_HEADERS}
    if root is not None:
        headers[ROOT_HEADER] = root["traceparent"]
    return headers


def _parent_of(request: Any, run_id: str | None) -> Context | None:
    """A task's parent context: its message headers, else the run's stored context."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    headers = dict(getattr(request, "headers", None) or {})
    found = {k: str(v) for k in _TRACE_HEADERS if (v := _header(request, headers, k))}
    root = _header(request, headers, ROOT_HEADER)
    if run_id is not None and root:
        _remember(run_id, {"traceparent": str(root)})
    if not found and run_id is not None:
        found = _root(run_id) or {}
    return TraceContextTextMapPropagator().extract(found) if found else None


def _header(request: Any, headers: Mapping[str, Any], key: str) -> Any:
    return getattr(request, key, None) or headers.get(key)


# --- spans ---------------------------------------------------------------------------------------


class _NoSpan:
    """What the hooks yield when tracing is off."""

    def set_attribute(self, key: str, value: Any) -> None:
        pass


_NO_SPAN = _NoSpan()


@contextmanager
def task_span(name: str, request: Any, run_id: str | None = None, **attrs: Any) -> Iterator[Any]:
    """A Celery task's span, a child of the context its dispatch carried."""
    if _tracer is None:
        yield _NO_SPAN
        return
    from opentelemetry.trace import SpanKind

    attributes = {f"treadle.{k}": v for k, v in attrs.items() if v is not None}
    if run_id is not None:
        attributes["treadle.run_id"] = run_id
    with _tracer.start_as_current_span(
        name, context=_parent_of(request, run_id), kind=SpanKind.CONSUMER, attributes=attributes
    ) as span:
        yield span


@contextmanager
def tool_span(name: str, call_id: str) -> Iterator[Any]:
    """One tool's execution (GenAI ``execute_tool``)."""
    if _tracer is None:
        yield _NO_SPAN
        return
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": name,
        "gen_ai.tool.call.id": call_id,
    }
    with _tracer.start_as_current_span(f"execute_tool {name}", attributes=attributes) as span:
        yield span


class _TracedModel:
    """A chat model whose calls are ``chat <model>`` client spans (GenAI conventions)."""

    def __init__(self, inner: ChatModel, profile: ModelProfile, tracer: Tracer) -> None:
        self._inner, self._profile, self._tracer = inner, profile, tracer

    def complete(self, request: Any, on_delta: Any = None, abort: Any = None) -> Any:
        from opentelemetry.trace import SpanKind

        profile = self._profile
        model = profile.model or profile.name
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": profile.provider,
            "gen_ai.request.model": model,
            "treadle.profile": profile.name,
        }
        if request.max_tokens:
            attributes["gen_ai.request.max_tokens"] = request.max_tokens
        host = urlsplit(profile.base_url).hostname if profile.base_url else None
        if host:
            attributes["server.address"] = host
        with self._tracer.start_as_current_span(
            f"chat {model}", kind=SpanKind.CLIENT, attributes=attributes
        ) as span:
            reply = self._inner.complete(request, on_delta, abort=abort)
            if reply.raw_model:
                span.set_attribute("gen_ai.response.model", reply.raw_model)
            if reply.finish_reason:
                span.set_attribute("gen_ai.response.finish_reasons", [reply.finish_reason])
            if reply.usage is not None:
                span.set_attribute("gen_ai.usage.input_tokens", reply.usage.input_tokens)
                span.set_attribute("gen_ai.usage.output_tokens", reply.usage.output_tokens)
            return reply


def traced_model(model: ChatModel, profile: ModelProfile) -> ChatModel:
    """``model`` itself when tracing is off, else a wrapper that traces each call."""
    if _tracer is None:
        return model
    return _TracedModel(model, profile, _tracer)
