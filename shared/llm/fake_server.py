"""A fake OpenAI-compatible chat server for tests and benchmarks (no real LLM).

``FakeLLMServer`` runs a Starlette app under uvicorn in a background thread on a free
127.0.0.1 port. Replies are programmed as ``ReplySpec`` values, taken in this order:

1. a queue (``enqueue(spec)`` appends, ``script(*specs)`` replaces the queue), one per request;
2. else ``responder(body) -> ReplySpec | dict | str``: stateless by request, for concurrent
   runs (e.g. choose the reply by counting assistant messages in ``body["messages"]``);
3. else the echo responder (``"echo: <last user text>"``).

A spec can inject faults: byte-split chunks, ``data:`` without a space, comment lines,
latency per chunk or before the first byte, a stall mid-stream, 400 when tools are sent,
any status with a JSON body and headers, a cut connection (no ``[DONE]``, the client sees a
broken chunked body), ``error`` chunks, ``event: error``, non-streaming JSON, or a verbatim
recorded SSE body. ``requests`` records every body and its headers; ``max_concurrency`` is
the most requests seen in flight at once; ``disconnects`` the times (epoch seconds) clients
closed a connection before its reply had been sent in full (a cancelled stream).

Strict by default, as OpenAI is: a request whose transcript leaves an assistant tool call
without its tool message, or has a tool message without a call, gets HTTP 400 with OpenAI's
message (``shared.llm.wire_check``) and takes no programmed reply; ``violations`` lists them.
``strict=False`` turns the check off (to test how a client reacts to a lenient server). Leaving
the ``with`` block with violations not cleared by ``reset()`` raises ``AssertionError``.

CLI: ``python -m shared.llm.fake_server --port 8765`` serves the echo responder.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from shared.agent.messages import content_text
from shared.agent.tokens import estimate_tokens
from shared.llm.wire_check import error_body, transcript_problem

__all__ = [
    "FakeLLMServer",
    "FakeState",
    "RecordedRequest",
    "ReplySpec",
    "Responder",
    "SpecLike",
    "StreamCut",
    "TOOLS_REJECTED_BODY",
    "completion_body",
    "create_app",
    "echo_responder",
    "main",
    "sse_events",
]

_AUTO = "auto"
TOOLS_REJECTED_BODY = {
    "error": {
        "message": "tools are not supported by this model",
        "type": "invalid_request_error",
        "param": "tools",
        "code": None,
    }
}


@dataclass(frozen=True)
class ReplySpec:
    """One programmed reply, with optional faults (see the module docstring)."""

    text: str = ""
    reasoning: str = ""
    # [{"name": ..., "arguments": str | dict, "id": optional}]
    tool_calls: Sequence[Mapping[str, Any]] = ()
    usage: Mapping[str, Any] | str | None = _AUTO  # "auto": computed when the client asks
    finish_reason: str | None = _AUTO  # "auto": tool_calls/stop; None: never sent
    # faults
    status: int = 200
    body: Any = None  # JSON (or text) body of a non-200 reply
    headers: Mapping[str, str] = field(default_factory=dict)
    reject_tools: bool = False  # 400 when the request carries tools/functions
    stream: bool | None = None  # None: as the request asks; False: a JSON body
    chunk_bytes: int | None = None  # re-split the SSE bytes into pieces of this size
    no_space: bool = False  # "data:{...}"
    comments: bool = False  # ": keep-alive" before every event
    chunk_latency: float = 0.0  # seconds between pieces
    first_byte_latency: float = 0.0  # seconds before the response starts
    hang: float = 0.0  # seconds of silence after the first piece
    cut_after: int | None = None  # abort the connection after N data events
    error_chunk: Mapping[str, Any] | None = None  # data: {"error": ...} after the content
    error_event: Mapping[str, Any] | None = None  # event: error + data: {"error": ...}
    done: bool = True  # send data: [DONE]
    raw: bytes | None = None  # send this SSE body verbatim (recorded fixtures)


SpecLike = ReplySpec | Mapping[str, Any] | str
Responder = Callable[[dict[str, Any]], SpecLike]


def _as_spec(value: SpecLike) -> ReplySpec:
    if isinstance(value, ReplySpec):
        return value
    if isinstance(value, str):
        return ReplySpec(text=value)
    return ReplySpec(**dict(value))


def echo_responder(body: dict[str, Any]) -> ReplySpec:
    """The default reply: ``echo: <the last user message>``."""
    users = [m for m in body.get("messages") or () if m.get("role") == "user"]
    return ReplySpec(text=f"echo: {content_text(users[-1].get('content')) if users else ''}")


@dataclass(frozen=True)
class RecordedRequest:
    path: str
    body: dict[str, Any]
    headers: dict[str, str]
    at: float = field(default_factory=time.time)  # when it arrived (epoch seconds)


class StreamCut(Exception):
    """Raised inside the app to abort a connection mid-body (a broken stream)."""


class _QuietFaults(logging.Filter):
    """Drops uvicorn's tracebacks for injected cuts and for replies cancelled at shutdown."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, StreamCut | asyncio.CancelledError)


class FakeState:
    """Programmed replies, recorded requests and concurrency counters (thread-safe)."""

    def __init__(
        self,
        responder: Responder | None = None,
        *,
        reject_tools: bool = False,
        strict: bool = True,
        keep_requests: bool = True,
    ) -> None:
        self._lock = threading.Lock()
        self.keep_requests = keep_requests  # False: a long-lived server (a bench) keeps none
        self._queue: deque[ReplySpec] = deque()
        self._requests: list[RecordedRequest] = []
        self._violations: list[str] = []
        self.responder: Responder | None = responder
        self.reject_tools = reject_tools
        self.strict = self._strict_default = strict
        self.in_flight = 0
        self.max_concurrency = 0
        self._disconnects: list[float] = []

    def enqueue(self, spec: SpecLike) -> None:
        with self._lock:
            self._queue.append(_as_spec(spec))

    def script(self, *specs: SpecLike) -> None:
        with self._lock:
            self._queue = deque(_as_spec(s) for s in specs)

    def reset(self) -> None:
        with self._lock:
            self._queue.clear()
            self._requests.clear()
            self._violations.clear()
            self._disconnects.clear()
            self.responder = None
            self.reject_tools = False
            self.strict = self._strict_default
            self.max_concurrency = self.in_flight

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    @property
    def disconnects(self) -> list[float]:
        """When clients closed a connection mid-reply (epoch seconds), in order."""
        with self._lock:
            return list(self._disconnects)

    def disconnected(self) -> None:
        with self._lock:
            self._disconnects.append(time.time())

    @property
    def violations(self) -> list[str]:
        """The transcript problems of the requests refused in strict mode."""
        with self._lock:
            return list(self._violations)

    def check(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """The 400 body for a transcript a strict provider refuses, else None."""
        if not self.strict:
            return None
        problem = transcript_problem(body["messages"])
        if problem is None:
            return None
        with self._lock:
            self._violations.append(problem[1])
        return error_body(*problem)

    def record(self, request: RecordedRequest) -> None:
        if not self.keep_requests:
            return
        with self._lock:
            self._requests.append(request)

    def next_spec(self, body: dict[str, Any]) -> ReplySpec:
        with self._lock:
            queued = self._queue.popleft() if self._queue else None
            responder = self.responder
        if queued is not None:
            return queued
        return _as_spec((responder or echo_responder)(body))

    def enter(self) -> None:
        with self._lock:
            self.in_flight += 1
            self.max_concurrency = max(self.max_concurrency, self.in_flight)

    def leave(self) -> None:
        with self._lock:
            self.in_flight -= 1


# --------------------------------------------------------------------------- wire building


def _pieces(text: str) -> list[str]:
    return re.findall(r"\S+\s*|\s+", text)


def _arguments(call: Mapping[str, Any]) -> str:
    args = call.get("arguments", {})
    return args if isinstance(args, str) else json.dumps(args)


def _split3(text: str) -> list[str]:
    size = max(1, -(-len(text) // 3))
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _usage(spec: ReplySpec, body: dict[str, Any], streaming: bool) -> Mapping[str, Any] | None:
    if spec.usage != _AUTO:
        return spec.usage if isinstance(spec.usage, Mapping) else None
    wants = bool((body.get("stream_options") or {}).get("include_usage"))
    if streaming and not wants:
        return None
    prompt = sum(estimate_tokens(content_text(m.get("content"))) + 4 for m in body["messages"])
    args = "".join(_arguments(c) for c in spec.tool_calls)
    completion = estimate_tokens(spec.text + spec.reasoning + args)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _legacy(body: dict[str, Any]) -> bool:
    return bool(body.get("functions")) and not body.get("tools")


def _finish(spec: ReplySpec, body: dict[str, Any]) -> str | None:
    if spec.finish_reason != _AUTO:
        return spec.finish_reason
    if not spec.tool_calls:
        return "stop"
    return "function_call" if _legacy(body) else "tool_calls"


def _call_id(call: Mapping[str, Any], i: int) -> str:
    return str(call.get("id") or f"call_fake_{i}")


def _tool_deltas(spec: ReplySpec, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    if _legacy(body):
        for call in spec.tool_calls[:1]:
            yield {"function_call": {"name": call["name"], "arguments": ""}}
            for piece in _split3(_arguments(call)):
                yield {"function_call": {"arguments": piece}}
        return
    for i, call in enumerate(spec.tool_calls):
        head = {"name": call["name"], "arguments": ""}
        yield {"tool_calls": [{"index": i, "id": _call_id(call, i), "function": head}]}
        for piece in _split3(_arguments(call)):
            yield {"tool_calls": [{"index": i, "function": {"arguments": piece}}]}


def _deltas(spec: ReplySpec, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield {"role": "assistant", "content": ""}
    for piece in _pieces(spec.reasoning):
        yield {"reasoning_content": piece}
    for piece in _pieces(spec.text):
        yield {"content": piece}
    yield from _tool_deltas(spec, body)


class _Chunks:
    def __init__(self, body: dict[str, Any]) -> None:
        self.id = f"chatcmpl-fake-{time.monotonic_ns()}"
        self.model = str(body.get("model") or "fake")

    def make(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self.model,
            "choices": choices,
            **extra,
        }

    def delta(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return self.make([{"index": 0, "delta": delta, "finish_reason": finish}])


def _stream_chunks(spec: ReplySpec, body: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """``(event name, payload)`` pairs of the stream, before framing."""
    chunks = _Chunks(body)
    for delta in _deltas(spec, body):
        yield "", chunks.delta(delta)
    if spec.error_chunk is not None:
        yield "", chunks.make([], error=dict(spec.error_chunk))
    if spec.error_event is not None:
        yield "error", {"error": dict(spec.error_event)}
    if spec.error_chunk is not None or spec.error_event is not None:
        return
    finish = _finish(spec, body)
    if finish is not None:
        yield "", chunks.delta({}, finish)
    usage = _usage(spec, body, streaming=True)
    if usage is not None:
        yield "", chunks.make([], usage=dict(usage))


def _frame(spec: ReplySpec, event: str, data: str) -> bytes:
    parts = [": keep-alive\n\n"] if spec.comments else []
    if event:
        parts.append(f"event: {event}\n")
    parts.append(f"{'data:' if spec.no_space else 'data: '}{data}\n\n")
    return "".join(parts).encode()


def sse_events(spec: ReplySpec, body: dict[str, Any]) -> list[bytes]:
    """The framed SSE events of a streaming reply (``[DONE]`` included unless cut/off)."""
    if spec.raw is not None:
        return [spec.raw]
    events = [
        _frame(spec, name, json.dumps(payload)) for name, payload in _stream_chunks(spec, body)
    ]
    if spec.cut_after is not None:
        return events[: spec.cut_after]
    if spec.done:
        events.append(_frame(spec, "", "[DONE]"))
    return events


def _rechunk(events: list[bytes], size: int | None) -> list[bytes]:
    if not size or size <= 0:
        return events
    blob = b"".join(events)
    return [blob[i : i + size] for i in range(0, len(blob), size)]


def completion_body(spec: ReplySpec, body: dict[str, Any]) -> dict[str, Any]:
    """A non-streaming ``chat.completion`` body for a spec."""
    message: dict[str, Any] = {"role": "assistant", "content": spec.text or None}
    if spec.reasoning:
        message["reasoning_content"] = spec.reasoning
    if spec.tool_calls and _legacy(body):
        call = spec.tool_calls[0]
        message["function_call"] = {"name": call["name"], "arguments": _arguments(call)}
    elif spec.tool_calls:
        message["tool_calls"] = [
            {
                "id": _call_id(c, i),
                "type": "function",
                "function": {"name": c["name"], "arguments": _arguments(c)},
            }
            for i, c in enumerate(spec.tool_calls)
        ]
    out: dict[str, Any] = {
        "id": f"chatcmpl-fake-{time.monotonic_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": str(body.get("model") or "fake"),
        "choices": [{"index": 0, "message": message, "finish_reason": _finish(spec, body)}],
    }
    usage = _usage(spec, body, streaming=False)
    if usage is not None:
        out["usage"] = dict(usage)
    return out


# --------------------------------------------------------------------------- ASGI


async def _send_body(
    send: Send, status: int, payload: Any, headers: Mapping[str, str] | None = None
) -> None:
    if isinstance(payload, str | bytes):
        data = payload.encode() if isinstance(payload, str) else payload
        ctype = "text/plain; charset=utf-8"
    else:
        data, ctype = json.dumps(payload).encode(), "application/json"
    raw = [(b"content-type", ctype.encode()), (b"content-length", str(len(data)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": data, "more_body": False})


class _ClientGone(Exception):
    """The client went away while the reply slept: stop serving it."""


class _Connection:
    """Watches for the client's disconnect so injected sleeps end with the connection."""

    def __init__(self, receive: Receive, on_gone: Callable[[], None]) -> None:
        self._gone = asyncio.Event()
        self._on_gone = on_gone
        self.done = False  # the reply was sent in full: a later disconnect is no news
        self._task = asyncio.create_task(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self._gone.set()
        if not self.done:
            self._on_gone()

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            return
        try:
            await asyncio.wait_for(self._gone.wait(), timeout=seconds)
        except TimeoutError:
            return
        raise _ClientGone

    def close(self) -> None:
        self._task.cancel()


async def _send_stream(
    spec: ReplySpec, body: dict[str, Any], send: Send, conn: _Connection
) -> None:
    headers = [
        (b"content-type", b"text/event-stream; charset=utf-8"),
        (b"cache-control", b"no-cache"),
    ]
    headers += [(k.lower().encode(), v.encode()) for k, v in spec.headers.items()]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    for i, piece in enumerate(_rechunk(sse_events(spec, body), spec.chunk_bytes)):
        if i and spec.chunk_latency:
            await conn.sleep(spec.chunk_latency)
        await send({"type": "http.response.body", "body": piece, "more_body": True})
        if i == 0 and spec.hang:
            await conn.sleep(spec.hang)
    if spec.cut_after is not None:
        raise StreamCut("fake server cut the stream")
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def _carries_tools(body: dict[str, Any]) -> bool:
    return bool(body.get("tools") or body.get("functions"))


def _default_error(status: int) -> dict[str, Any]:
    return {"error": {"message": f"fake error {status}", "type": "fake_error", "code": status}}


async def _serve(
    state: FakeState, spec: ReplySpec, body: dict[str, Any], send: Send, conn: _Connection
) -> None:
    await conn.sleep(spec.first_byte_latency)
    if (state.reject_tools or spec.reject_tools) and _carries_tools(body):
        await _send_body(send, 400, TOOLS_REJECTED_BODY)
    elif spec.status != 200:
        payload = spec.body if spec.body is not None else _default_error(spec.status)
        await _send_body(send, spec.status, payload, spec.headers)
    elif spec.stream is False or not body.get("stream"):
        await _send_body(send, 200, completion_body(spec, body), spec.headers)
    else:
        await _send_stream(spec, body, send, conn)


class _ChatEndpoint:
    """``POST .../chat/completions`` as a raw ASGI app (it must be able to cut a stream)."""

    def __init__(self, state: FakeState) -> None:
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            body = json.loads(await request.body())
        except ValueError:
            await _send_body(send, 400, {"error": {"message": "body is not JSON"}})
            return
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            await _send_body(send, 400, {"error": {"message": "`messages` is required"}})
            return
        self.state.record(RecordedRequest(request.url.path, body, dict(request.headers)))
        refused = self.state.check(body)
        if refused is not None:
            await _send_body(send, 400, refused)
            return
        self.state.enter()
        conn = _Connection(receive, self.state.disconnected)
        try:
            await _serve(self.state, self.state.next_spec(body), body, send, conn)
            conn.done = True
        except _ClientGone:
            return
        finally:
            conn.close()
            self.state.leave()


def create_app(state: FakeState) -> Starlette:
    """The ASGI app serving ``state``."""
    chat = _ChatEndpoint(state)

    async def models(_: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": "fake", "object": "model"}]})

    async def health(_: Request) -> JSONResponse:
        return JSONResponse({"ok": True})

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/chat/completions", chat, methods=["POST"]),
            Route("/v1/models", models),
            Route("/healthz", health),
        ]
    )


# --------------------------------------------------------------------------- server


class FakeLLMServer:
    """The fake server on a free local port, in a background thread (a context manager)."""

    def __init__(
        self,
        responder: Responder | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        reject_tools: bool = False,
        strict: bool = True,
    ) -> None:
        self.state = FakeState(responder, reject_tools=reject_tools, strict=strict)
        self.app = create_app(self.state)
        self.host = host
        self._port = port
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle

    def start(self) -> FakeLLMServer:
        logging.getLogger("uvicorn.error").addFilter(_QUIET)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self._port))
        self._port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app, log_config=None, log_level="warning", lifespan="off", access_log=False
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="fake-llm", daemon=True
        )
        self._thread.start()
        self._wait_started()
        return self

    def _wait_started(self) -> None:
        deadline = time.monotonic() + 10
        while self._server is not None and not self._server.started:
            if time.monotonic() > deadline or not (self._thread and self._thread.is_alive()):
                raise RuntimeError("the fake LLM server did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self._server.force_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = self._thread = None

    def __enter__(self) -> FakeLLMServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        self.stop()
        if exc_type is None and self.violations:
            # a request a strict provider refuses can still end well (the client's fallback to
            # prompt mode, SPEC M-6, hides it): fail the test that sent it
            raise AssertionError(f"requests a strict provider refuses: {self.violations}")

    # -- programming and inspection

    @property
    def port(self) -> int:
        return self._port

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self._port}/v1"

    @property
    def responder(self) -> Responder | None:
        return self.state.responder

    @responder.setter
    def responder(self, responder: Responder | None) -> None:
        self.state.responder = responder

    @property
    def reject_tools(self) -> bool:
        return self.state.reject_tools

    @reject_tools.setter
    def reject_tools(self, value: bool) -> None:
        self.state.reject_tools = value

    @property
    def strict(self) -> bool:
        return self.state.strict

    @strict.setter
    def strict(self, value: bool) -> None:
        self.state.strict = value

    def enqueue(self, spec: SpecLike) -> None:
        self.state.enqueue(spec)

    def script(self, *specs: SpecLike) -> None:
        self.state.script(*specs)

    def reset(self) -> None:
        self.state.reset()

    @property
    def requests(self) -> list[RecordedRequest]:
        return self.state.requests

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [r.body for r in self.state.requests]

    @property
    def max_concurrency(self) -> int:
        return self.state.max_concurrency

    @property
    def disconnects(self) -> list[float]:
        """When clients closed a connection mid-reply (epoch seconds), in order."""
        return self.state.disconnects

    @property
    def violations(self) -> list[str]:
        return self.state.violations

    @property
    def pending(self) -> int:
        return self.state.pending


_QUIET = _QuietFaults()


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m shared.llm.fake_server``: serve the echo responder."""
    parser = argparse.ArgumentParser(description="fake OpenAI-compatible chat server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--chunk-latency", type=float, default=0.0, help="seconds per chunk")
    parser.add_argument("--first-byte-latency", type=float, default=0.0, help="seconds")
    parser.add_argument("--log-level", default="warning")
    parser.add_argument(
        "--lenient", action="store_true", help="accept dangling tool calls (no strict check)"
    )
    args = parser.parse_args(argv)

    def responder(body: dict[str, Any]) -> ReplySpec:
        echo = echo_responder(body)
        return ReplySpec(
            text=echo.text,
            chunk_latency=args.chunk_latency,
            first_byte_latency=args.first_byte_latency,
        )

    logging.getLogger("uvicorn.error").addFilter(_QUIET)
    app = create_app(FakeState(responder, strict=not args.lenient))
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False)


if __name__ == "__main__":
    main()
