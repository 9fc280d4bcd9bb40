"""The OpenAI-compatible chat client (SPEC M-1…M-10) over httpx and httpx-sse.

One ``complete()`` is one model turn for the loop. It may make more than one HTTP call: the
400-without-tools resend (M-6), the prompt-mode fallback of ``tool_mode: auto`` (M-7) and
length continuations (M-10). It never retries transient errors itself: it raises
``TransientModelError`` (with ``status`` and ``retry_after``) and the round task backs off
(``shared.llm.backoff``).

Given an ``Abort`` (``shared.llm.abort``), every HTTP call of the turn ends when it fires: its
deadline shortens the timeouts, and the socket is shut down at the deadline or on
``cancel()`` (a silent stream included). The turn then raises the handle's ``Aborted``.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import itertools
import json
import logging
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson
from httpx_sse import EventSource, ServerSentEvent, connect_sse

from shared.agent.messages import Message, Reply, Usage, content_text
from shared.agent.spec import ModelProfile
from shared.agent.tokens import estimate_tokens
from shared.errors import (
    Aborted,
    BrokenStream,
    FatalModelError,
    ModelError,
    ToolsRejected,
    TransientModelError,
)
from shared.llm import abort as aborts
from shared.llm.abort import Abort
from shared.llm.backoff import parse_retry_after
from shared.llm.base import Delta, DeltaSink, ModelRequest, ToolDef
from shared.llm.prompt_mode import PromptDeltaGate, parse_prompt_reply, to_prompt_messages
from shared.llm.stream import (
    StreamAccumulator,
    error_for_status,
    error_from_payload,
    provider_message,
    reply_from_completion,
    retry_after_in_text,
    tools_unsupported,
)
from shared.llm.tool_modes import ToolModes, WireMode

__all__ = [
    "CONTINUE_PROMPT",
    "OpenAICompatModel",
    "WireMode",
    "build_body",
    "wire_messages",
]

log = logging.getLogger(__name__)

DEFAULT_RETRY_AFTER_CAP_S = 60.0
DRAIN_EVENTS = 8  # events read after [DONE] to reach the body's end (a kept-alive connection)
DRAIN_S = 0.25
CONTINUE_PROMPT = "Continue exactly where your last message stopped. Do not repeat anything."

# --------------------------------------------------------------------------- request bodies


def _function_turns(messages: Sequence[Message]) -> Iterator[dict[str, Any]]:
    """Legacy ``function_call`` history: one call per assistant turn, results as ``function``."""
    names = {c.id: c.name for m in messages for c in m.tool_calls}
    for msg in messages:
        if msg.role == "assistant" and msg.tool_calls:
            for k, call in enumerate(msg.tool_calls):
                yield {
                    "role": "assistant",
                    "content": (msg.content or None) if k == 0 else None,
                    "function_call": {"name": call.name, "arguments": call.arguments},
                }
        elif msg.role == "tool":
            name = msg.name or names.get(msg.tool_call_id or "") or "tool"
            yield {"role": "function", "name": name, "content": msg.text or "(empty)"}
        else:
            yield msg.to_wire()


def wire_messages(messages: Sequence[Message], mode: WireMode = "native") -> list[dict[str, Any]]:
    """Messages as wire dicts (lowercase keys, SPEC M-5) for a tool mode."""
    kept = [m for m in messages if not m.droppable]
    if mode == "function":
        return list(_function_turns(kept))
    return [m.to_wire() for m in kept]


def _tool_choice(choice: str) -> str | dict[str, Any]:
    if choice in ("none", "auto", "required"):
        return choice
    return {"type": "function", "function": {"name": choice}}


def _function_choice(choice: str) -> str | dict[str, Any]:
    return choice if choice in ("none", "auto") else {"name": choice}


def _add_tools(body: dict[str, Any], request: ModelRequest, mode: WireMode) -> None:
    if not request.tools:
        return
    if mode == "native":
        body["tools"] = [t.to_wire() for t in request.tools]
        if request.tool_choice:
            body["tool_choice"] = _tool_choice(request.tool_choice)
    elif mode == "function":
        body["functions"] = [t.to_wire()["function"] for t in request.tools]
        if request.tool_choice:
            body["function_call"] = _function_choice(request.tool_choice)


def _prompt_tools(request: ModelRequest) -> tuple[ToolDef, ...]:
    return request.tools if request.tool_choice != "none" else ()


def build_body(
    profile: ModelProfile,
    request: ModelRequest,
    mode: WireMode,
    tail: Sequence[Message] = (),
) -> dict[str, Any]:
    """The JSON body of one call. ``tail`` (continuation turns) is appended as it is.

    ``profile.extra`` is merged last; an extra key set to ``null`` removes a default field
    (e.g. ``max_tokens: null`` for endpoints that want ``max_completion_tokens``).
    """
    if mode == "prompt":
        history = to_prompt_messages(request.messages, _prompt_tools(request))
    else:
        history = list(request.messages)
    body: dict[str, Any] = {
        "model": profile.model,
        "messages": wire_messages([*history, *tail], mode),
        "stream": profile.stream,
    }
    if profile.stream and profile.stream_usage:
        body["stream_options"] = {"include_usage": True}
    limit = profile.max_tokens
    body["max_tokens"] = min(request.max_tokens, limit) if request.max_tokens else limit
    _add_tools(body, request, mode)
    if request.response_format is not None:
        body["response_format"] = request.response_format
    body.update(profile.extra)
    return {k: v for k, v in body.items() if v is not None}


def encode_body(body: dict[str, Any]) -> bytes:
    """The request body as compact UTF-8 JSON, what httpx's ``json=`` writes (byte for byte
    but for a float's spelling: ``1e-7`` for ``1e-07``), by orjson. The whole history goes
    out every round, and the standard library's encoder was a third of a long run's round CPU
    (py-spy of a worker at rounds 100-400): a 400-round history encodes in 0.35 ms instead
    of 2.6. What orjson refuses (an integer past 64 bits, a key that is not a string) goes
    through the standard library as before; a NaN, which that refused, goes as ``null``."""
    try:
        return orjson.dumps(body)
    except (orjson.JSONEncodeError, TypeError):
        text = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        return text.encode("utf-8")


def _has_tools(body: dict[str, Any]) -> bool:
    return bool(body.get("tools") or body.get("functions"))


# --------------------------------------------------------------------------- usage


def _estimate_usage(body: dict[str, Any], reply: Reply) -> Usage:
    """SPEC M-9: no usage from the provider → an estimate, marked as such."""
    prompt = sum(estimate_tokens(content_text(m.get("content"))) + 4 for m in body["messages"])
    tools = body.get("tools") or body.get("functions")
    if tools:
        prompt += estimate_tokens(json.dumps(tools))
    args = "".join(c.arguments for c in reply.tool_calls)
    output = estimate_tokens(reply.text + reply.reasoning + args)
    return Usage(input_tokens=prompt, output_tokens=output, estimated=True)


def _sum_usage(usages: Sequence[Usage]) -> Usage:
    return Usage(
        input_tokens=sum(u.input_tokens for u in usages),
        output_tokens=sum(u.output_tokens for u in usages),
        cached_input_tokens=sum(u.cached_input_tokens for u in usages),
        reasoning_tokens=sum(u.reasoning_tokens for u in usages),
        estimated=any(u.estimated for u in usages),
    )


def _combine(replies: Sequence[Reply]) -> Reply:
    """Continuations (M-10) joined into one reply; each call's usage kept in ``extra``."""
    if len(replies) == 1:
        return replies[0]
    usages = [r.usage for r in replies if r.usage is not None]
    last = replies[-1]
    return replace(
        last,
        text="".join(r.text for r in replies),
        reasoning="".join(r.reasoning for r in replies),
        usage=_sum_usage(usages),
        extra={
            **last.extra,
            "continuations": len(replies) - 1,
            "call_usages": [u.to_dict() for u in usages],
        },
    )


# --------------------------------------------------------------------------- HTTP errors


class _TotalTimeout(Exception):
    pass


class _DeadlineStream(httpx.SyncByteStream):
    """Wraps a response body so a slow trickle cannot outlive the total timeout."""

    def __init__(self, inner: Iterable[bytes], deadline: float) -> None:
        self._inner = inner
        self._deadline = deadline

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._inner:
            if time.monotonic() > self._deadline:
                raise _TotalTimeout
            yield chunk

    def close(self) -> None:
        close = getattr(self._inner, "close", None)
        if callable(close):
            close()


def _body_of(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text


def _retry_after(response: httpx.Response, message: str) -> float | None:
    millis = response.headers.get("retry-after-ms")
    if millis:
        seconds = parse_retry_after(millis, datetime.now(UTC))
        if seconds is not None:
            return seconds / 1000.0
    seconds = parse_retry_after(response.headers.get("retry-after"), datetime.now(UTC))
    return seconds if seconds is not None else retry_after_in_text(message)


def _http_error(
    response: httpx.Response, had_tools: bool, retry_after_cap: float = DEFAULT_RETRY_AFTER_CAP_S
) -> ModelError:
    """SPEC M-8 (+ M-6): the typed error for a non-2xx response, with the provider message.
    A ``Retry-After`` is capped: the provider (perhaps a tenant's own server) does not decide
    how long a profile pauses."""
    status = response.status_code
    message = f"HTTP {status}: {provider_message(_body_of(response)) or response.reason_phrase}"
    if status == 400 and had_tools:
        return ToolsRejected(message, status, tools_unsupported(_body_of(response), message))
    wait = _retry_after(response, message)
    return error_for_status(status, message, None if wait is None else min(wait, retry_after_cap))


def _transport_error(exc: Exception) -> TransientModelError:
    if isinstance(exc, _TotalTimeout):
        return TransientModelError("model call exceeded its total timeout")
    if isinstance(exc, httpx.TimeoutException):
        return TransientModelError(f"model call timed out ({type(exc).__name__})")
    return TransientModelError(f"model connection failed ({type(exc).__name__}: {exc})")


def _json_chunk(data: str) -> Any:
    try:
        return json.loads(data)
    except ValueError as exc:
        raise TransientModelError(f"malformed stream chunk: {data[:200]!r}") from exc


# --------------------------------------------------------------------------- the model


def _noop(_: Delta) -> None:
    return None


class OpenAICompatModel:
    """``ChatModel`` for any OpenAI-compatible ``/chat/completions`` endpoint."""

    def __init__(
        self,
        profile: ModelProfile,
        *,
        api_key: str | None = None,
        client: httpx.Client | None = None,
        retry_after_cap: float = DEFAULT_RETRY_AFTER_CAP_S,
        tool_modes: ToolModes | None = None,
    ) -> None:
        self.profile = profile
        # what ``auto`` learnt (M-7): the runtime's, shared by the process; else this model's
        self.tool_modes = tool_modes if tool_modes is not None else ToolModes()
        self.name = profile.name
        self._api_key = api_key
        self._retry_after_cap = retry_after_cap
        self._owns_client = client is None
        self._client = client or httpx.Client(transport=aborts.abortable_transport())

    def close(self) -> None:
        if self._owns_client:
            self._client.close()

    # -- public

    def complete(
        self, request: ModelRequest, on_delta: DeltaSink | None = None, abort: Abort | None = None
    ) -> Reply:
        if abort is None:
            return self._complete(request, on_delta or _noop)
        with abort.bound():
            return self._complete(request, on_delta or _noop)

    def _complete(self, request: ModelRequest, sink: DeltaSink) -> Reply:
        mode = self._mode()
        if mode == "prompt":
            return self._prompt_turn(request, sink)
        try:
            return self._turn(request, mode, sink)
        except ToolsRejected as first:
            return self._without_tools(request, mode, first, sink)

    # -- modes

    def _mode(self) -> WireMode:
        configured = self.profile.tool_mode
        if configured != "auto":
            return configured
        return self.tool_modes.get(self.profile) or "native"

    def _without_tools(
        self, request: ModelRequest, mode: WireMode, first: ToolsRejected, sink: DeltaSink
    ) -> Reply:
        """SPEC M-6/M-7: resend once without tools (``auto``: in prompt mode; when the 400
        said the endpoint does not take tools, the profile stays in prompt mode for the
        ``ToolModes``' TTL).

        If the resend fails too, the first 400 is raised, the closer cause, unless the resend
        failed transiently: then that error is raised so the round is retried.
        """
        try:
            if self.profile.tool_mode == "auto":
                reply = self._prompt_turn(request, sink)
                if first.about_tools:
                    self.tool_modes.remember(self.profile, "prompt")
                    log.info("model profile %s rejects tools; using prompt mode", self.name)
            else:
                reply = self._turn(replace(request, tools=(), tool_choice=None), mode, sink)
        except TransientModelError:
            raise
        except ModelError as second:
            raise first from second
        return replace(reply, extra={**reply.extra, "tools_rejected": first.message})

    def _prompt_turn(self, request: ModelRequest, sink: DeltaSink) -> Reply:
        """SPEC M-7 prompt mode: tools in the system prompt, reply parsed for ``0:``/``1:``."""
        offered = bool(_prompt_tools(request))
        gate = PromptDeltaGate(tools_offered=offered)

        def gated(delta: Delta) -> None:
            if delta.kind != "text":
                sink(delta)
            elif shown := gate.push(delta.text):
                sink(replace(delta, text=shown))

        raw = self._turn(request, "prompt", gated)
        if rest := gate.finish():
            sink(Delta(kind="text", text=rest))
        digest = hashlib.sha256(f"{len(request.messages)}:{raw.text}".encode()).hexdigest()
        parsed = parse_prompt_reply(raw.text, f"call_{digest[:16]}", tools_offered=offered)
        extra: dict[str, Any] = {**raw.extra, "tool_mode": "prompt"}
        if parsed.error:
            extra["prompt_error"] = parsed.error
        if parsed.call is None:
            return replace(raw, text=parsed.answer, extra=extra)
        call = parsed.call
        sink(Delta(kind="tool", index=0, name=call.name, text=call.arguments))
        return replace(raw, text="", tool_calls=(call,), finish_reason="tool_calls", extra=extra)

    def _turn(self, request: ModelRequest, mode: WireMode, sink: DeltaSink) -> Reply:
        """One model turn in a wire mode, with length continuations (SPEC M-10)."""
        replies = [self._call(build_body(self.profile, request, mode), sink)]
        while self._should_continue(replies):
            tail = (
                Message(role="assistant", content="".join(r.text for r in replies)),
                Message(role="user", content=CONTINUE_PROMPT),
            )
            replies.append(self._call(build_body(self.profile, request, mode, tail), sink))
        return _combine(replies)

    def _should_continue(self, replies: Sequence[Reply]) -> bool:
        last = replies[-1]
        return (
            last.finish_reason == "length"
            and not last.tool_calls
            and len(replies) <= self.profile.max_continuations
        )

    # -- one HTTP call

    def _call(self, body: dict[str, Any], sink: DeltaSink) -> Reply:
        abort = aborts.current()
        total = abort.limit(self.profile.timeout_total) if abort else self.profile.timeout_total
        deadline = time.monotonic() + (total or 0.0)
        try:
            if abort is not None:
                abort.check()
            if body.get("stream"):
                reply = self._stream(body, sink, deadline)
            else:
                reply = self._post(body, sink, deadline)
        except (httpx.RequestError, httpx.StreamError, _TotalTimeout, ModelError) as exc:
            if abort is not None and abort.fired and not isinstance(exc, Aborted):
                raise abort.error() from exc  # the handle shut the socket, not the provider
            if isinstance(exc, ModelError):
                raise
            raise _transport_error(exc) from exc
        if reply.usage is None:
            reply = replace(reply, usage=_estimate_usage(body, reply))
        return reply

    def _stream(self, body: dict[str, Any], sink: DeltaSink, deadline: float) -> Reply:
        with connect_sse(
            self._client, "POST", self._url(), **self._http_options(deadline, body)
        ) as source:
            response = source.response
            self._check(response, body)
            ctype = response.headers.get("content-type", "")
            if "json" in ctype:  # some servers ignore stream: true
                response.read()
                return self._from_completion(response, sink)
            if "text/event-stream" not in ctype:
                raise FatalModelError(f"model endpoint answered with content-type {ctype!r}")
            response.stream = _DeadlineStream(response.stream, deadline)  # type: ignore[arg-type]
            acc = StreamAccumulator()
            try:
                done = _consume(source, acc, sink, deadline)
            except (httpx.RequestError, httpx.StreamError, _TotalTimeout) as exc:
                raise _broken(body, acc, _transport_error(exc).message) from exc
        reply = acc.result()
        if not done and reply.finish_reason is None:
            raise _broken(body, acc, "model stream ended without [DONE] or a finish_reason")
        return replace(reply, extra={**reply.extra, "done": done})

    def _post(self, body: dict[str, Any], sink: DeltaSink, deadline: float) -> Reply:
        response = self._client.post(self._url(), **self._http_options(deadline, body))
        self._check(response, body)
        return self._from_completion(response, sink)

    def _check(self, response: httpx.Response, body: dict[str, Any]) -> None:
        if response.status_code >= 300:
            response.read()
            raise _http_error(response, _has_tools(body), self._retry_after_cap)

    @staticmethod
    def _from_completion(response: httpx.Response, sink: DeltaSink) -> Reply:
        payload = _body_of(response)
        if not isinstance(payload, dict):
            raise FatalModelError(f"model endpoint returned a non-JSON body: {payload!r:.200}")
        reply, deltas = reply_from_completion(payload)
        for delta in deltas:
            sink(delta)
        return reply

    def _url(self) -> str:
        return self.profile.base_url.rstrip("/") + "/chat/completions"

    def _http_options(self, deadline: float, body: dict[str, Any]) -> dict[str, Any]:
        remaining = max(0.001, deadline - time.monotonic())
        read = min(self.profile.timeout_read, remaining)
        timeout = httpx.Timeout(
            connect=min(self.profile.timeout_connect, remaining), read=read, write=read, pool=read
        )
        headers = {**self._headers(), "Content-Type": "application/json"}
        return {"content": encode_body(body), "headers": headers, "timeout": timeout}

    def _headers(self) -> dict[str, str]:
        key = self._api_key
        env = self.profile.api_key_env
        if key is None and env:
            key = os.environ.get(env)
            if not key:
                raise FatalModelError(
                    f"model profile {self.name!r}: environment variable {env} is not set"
                )
        return {"Authorization": f"Bearer {key}"} if key else {}


def _consume(source: EventSource, acc: StreamAccumulator, sink: DeltaSink, deadline: float) -> bool:
    """SPEC M-2: read SSE events into ``acc`` until ``[DONE]`` (True) or the end of the
    body (False)."""
    abort = aborts.current()
    events = source.iter_sse()
    for event in events:
        if abort is not None:
            abort.check()
        if time.monotonic() > deadline:
            raise _TotalTimeout
        if event.data.strip() == "[DONE]":
            _drain(events)
            return True
        for delta in _feed_event(acc, event):
            sink(delta)
    return False


def _drain(events: Iterator[ServerSentEvent]) -> None:
    """After ``[DONE]``, read to the body's end so its kept-alive connection goes back to the
    pool (httpcore closes a connection whose response was not read to the end: every call
    would open a new connection, a TLS handshake each). Bounded: at most ``DRAIN_EVENTS``
    more events within ``DRAIN_S``; a server that sends more, or holds the body open, only
    loses its connection — the reply is complete either way."""
    with (
        contextlib.suppress(httpx.HTTPError, Aborted, _TotalTimeout),
        Abort(time.time() + DRAIN_S).bound(),  # each read waits at most the time left
    ):
        collections.deque(itertools.islice(events, DRAIN_EVENTS), maxlen=0)


def _broken(body: dict[str, Any], acc: StreamAccumulator, why: str) -> BrokenStream:
    """SPEC M-2/M-8: a stream that began and did not end — neither ``[DONE]`` nor a
    ``finish_reason`` came (the server closed the connection mid-reply, or it broke) — is a
    transient error, never an answer. Every real provider ends with one of the two. The
    partial call is estimated from what was sent and what streamed: the provider bills it."""
    partial = _estimate_usage(body, acc.result())
    return BrokenStream(f"broken model stream after {acc.chunks} chunks: {why}", partial.to_dict())


def _feed_event(acc: StreamAccumulator, event: ServerSentEvent) -> list[Delta]:
    data = event.data.strip()
    if event.event == "error":
        payload = _json_chunk(data) if data.startswith(("{", "[")) else data
        raise error_from_payload(payload or {"message": "error event without data"})
    if not data:
        return []
    chunk = _json_chunk(data)
    return acc.feed(chunk) if isinstance(chunk, dict) else []
