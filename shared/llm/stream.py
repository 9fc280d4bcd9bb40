"""Pure assembly of OpenAI-compatible ``chat.completion.chunk`` objects into one ``Reply``.

No I/O: the HTTP client parses SSE and feeds each JSON chunk here (modelled on pydantic-ai's
``_parts_manager``). The rules are SPEC M-3 (text, reasoning, usage) and M-4 (tool calls);
an ``error`` object in a chunk raises a typed ``ModelError`` (M-2), never an empty success.

The error helpers (``provider_message``, ``error_for_status``, ``error_from_payload``) also
serve the HTTP client, so a provider error reads the same whether it came as an HTTP body or
inside the stream.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.agent.messages import Reply, ToolCall, Usage
from shared.errors import FatalModelError, ModelError, TransientModelError
from shared.llm.base import Delta

__all__ = [
    "StreamAccumulator",
    "error_for_status",
    "error_from_payload",
    "is_transient_status",
    "provider_message",
    "reply_from_completion",
    "retry_after_in_text",
    "tools_unsupported",
    "usage_from_wire",
]

_MAX_MESSAGE = 2000
_TRANSIENT_WORDS = ("rate_limit", "server_error", "overloaded", "timeout", "unavailable")


# --------------------------------------------------------------------------- errors


def is_transient_status(status: int) -> bool:
    """SPEC M-8: 429 and 5xx are transient (408 Request Timeout too: it is a timeout)."""
    return status in (408, 429) or status >= 500


def _clip(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _MAX_MESSAGE else text[:_MAX_MESSAGE] + "…"


def _message_of_error_object(err: Mapping[str, Any]) -> str:
    message = str(err.get("message") or err.get("detail") or "").strip()
    metadata = err.get("metadata")
    raw = metadata.get("raw") if isinstance(metadata, Mapping) else None
    if isinstance(raw, str) and raw.strip() and raw.strip() not in message:
        message = f"{message}: {raw.strip()}" if message else raw.strip()
    if not message:
        message = json.dumps(err, ensure_ascii=False, default=str)
    return message


def provider_message(body: Any) -> str:
    """The human message inside a provider error body (parsed JSON or plain text).

    Shapes seen in the wild (fixtures/sse/errors): ``{"error": {"message": ...}}`` (OpenAI,
    Groq, Ollama compat), ``{"error": "<text>"}`` (Ollama native), OpenRouter's
    ``metadata.raw`` explaining a generic message, ``[{"error": ...}]`` (Gemini), FastAPI's
    ``{"detail": ...}``, or plain text.
    """
    if isinstance(body, list) and body:
        return provider_message(body[0])
    if isinstance(body, Mapping):
        err = body.get("error")
        if isinstance(err, str) and err.strip():
            return _clip(err)
        if isinstance(err, Mapping):
            return _clip(_message_of_error_object(err))
        for key in ("message", "detail"):
            if body.get(key):
                value = body[key]
                return _clip(value if isinstance(value, str) else json.dumps(value, default=str))
        return _clip(json.dumps(body, ensure_ascii=False, default=str))
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    return _clip(str(body)) if body is not None else ""


def error_for_status(
    status: int | None, message: str, retry_after: float | None = None, *, kind: str = ""
) -> ModelError:
    """Map an HTTP status (or a stream error without one) to the typed error (SPEC M-8)."""
    if status is None:
        transient = any(word in kind.lower() for word in _TRANSIENT_WORDS)
    else:
        transient = is_transient_status(status)
    if transient:
        return TransientModelError(message, status, retry_after)
    return FatalModelError(message, status)


def _status_of(err: Mapping[str, Any]) -> int | None:
    for key in ("status_code", "status", "code"):
        value = err.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599:
            return value
        if isinstance(value, str) and value.isdigit() and 100 <= int(value) <= 599:
            return int(value)
    return None


def error_from_payload(payload: Any) -> ModelError:
    """The typed error for an ``error`` object sent inside a stream (or ``event: error``)."""
    err = payload.get("error", payload) if isinstance(payload, Mapping) else payload
    if not isinstance(err, Mapping):
        return FatalModelError(_clip(f"model stream error: {provider_message(err)}"))
    kind = f"{err.get('type') or ''} {err.get('code') or ''}"
    message = f"model stream error: {_message_of_error_object(err)}"
    return error_for_status(_status_of(err), _clip(message), kind=kind)


_TOOL_PARAMS = frozenset({"tools", "tool_choice", "functions", "function_call"})
_TOOL_WORDS = (
    r"(?:tools?|tool[_ ]?choice|tool[_ ]calls?|tool[_ ]calling|tool[_ ]use|"
    r"functions?|function[_ ]call(?:s|ing)?)"
)
_TOOLS_UNSUPPORTED = re.compile(
    # "does not support tools", "doesn't support function calling"
    rf"(?:not|n't|cannot|can't)\s+(?:support|accept|handle|allow)\w*\s+(?:\S+\s+){{0,2}}?"
    rf"{_TOOL_WORDS}\b"
    # "tools are not supported", "tool_choice ... unsupported", "function calling is disabled"
    rf"|\b{_TOOL_WORDS}\b[^.;]{{0,60}}?\b(?:not supported|unsupported|not enabled|"
    rf"not available|not allowed|disabled|requires)\b"
    # vLLM: "auto" tool choice requires --enable-auto-tool-choice; llama.cpp: "tools param"
    r"|enable-auto-tool-choice|\btools? param",
    re.IGNORECASE,
)


def tools_unsupported(body: Any, message: str) -> bool:
    """Whether a 400 says the endpoint does not take tools (M-7), not something else about
    the request: the error's ``param`` names the tools, or its message says they are not
    supported. A tool call the model got wrong (Groq's ``tool_use_failed``) is not that."""
    err = body[0] if isinstance(body, list) and body else body
    err = err.get("error", err) if isinstance(err, Mapping) else err
    if isinstance(err, Mapping) and str(err.get("param") or "") in _TOOL_PARAMS:
        return True
    return bool(_TOOLS_UNSUPPORTED.search(message))


# --------------------------------------------------------------------------- usage


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def usage_from_wire(raw: Mapping[str, Any]) -> Usage:
    """A provider's usage → ``Usage`` (M-9): OpenAI's (cached tokens in
    ``prompt_tokens_details``, reasoning tokens in ``completion_tokens_details``), DeepSeek's
    ``prompt_cache_hit_tokens``, and an Anthropic-style one (``input_tokens`` without the
    ``cache_read_input_tokens`` and ``cache_creation_input_tokens``, which count too)."""
    details = raw.get("prompt_tokens_details")
    cached = _int(details.get("cached_tokens")) if isinstance(details, Mapping) else 0
    cached = cached or _int(raw.get("prompt_cache_hit_tokens"))
    out_details = raw.get("completion_tokens_details")
    reasoning = _int(out_details.get("reasoning_tokens")) if isinstance(out_details, Mapping) else 0
    reasoning = reasoning or _int(raw.get("reasoning_tokens"))
    if "prompt_tokens" in raw or "cache_read_input_tokens" not in raw:
        inputs = _int(raw.get("prompt_tokens", raw.get("input_tokens")))
    else:  # Anthropic-style: the cache reads and writes are not in input_tokens
        cached = _int(raw.get("cache_read_input_tokens"))
        inputs = _int(raw.get("input_tokens")) + cached
        inputs += _int(raw.get("cache_creation_input_tokens"))
    return Usage(
        input_tokens=inputs,
        output_tokens=_int(raw.get("completion_tokens", raw.get("output_tokens"))),
        cached_input_tokens=cached,
        reasoning_tokens=reasoning,
    )


# --------------------------------------------------------------------------- tool calls


@dataclass(slots=True)
class _ToolSlot:
    index: int
    id: str = ""
    name: str = ""
    pieces: list[str] = field(default_factory=list)

    def to_call(self) -> ToolCall:
        args = "".join(self.pieces)
        return ToolCall(id=self.id or f"call_{self.index}", name=self.name, arguments=args or "{}")


def _text_of_parts(parts: Any) -> str:
    """Text inside a (possibly nested) list of content parts, or a plain string."""
    if isinstance(parts, str):
        return parts
    if isinstance(parts, Sequence):
        return "".join(_text_of_parts(p.get("text", "")) for p in parts if isinstance(p, Mapping))
    return ""


def _split_content(content: Any) -> tuple[str, str]:
    """SPEC M-3: ``(answer, reasoning)`` from a delta's ``content``."""
    if isinstance(content, str):
        return content, ""
    answer: list[str] = []
    reasoning: list[str] = []
    for part in content if isinstance(content, list) else ():
        if not isinstance(part, Mapping):
            continue
        if part.get("type") == "thinking":
            reasoning.append(_text_of_parts(part.get("thinking", "")))
        elif part.get("type") in ("text", None):
            answer.append(_text_of_parts(part.get("text", "")))
    return "".join(answer), "".join(reasoning)


def _reasoning_of(delta: Mapping[str, Any]) -> str:
    """SPEC M-3: ``reasoning_content``, else ``reasoning`` (servers that send both repeat it)."""
    for key in ("reasoning_content", "reasoning"):
        value = delta.get(key)
        if isinstance(value, str) and value:
            return value
    return ""


class StreamAccumulator:
    """Feed chunks in order with ``feed``; read the assembled reply with ``result``."""

    def __init__(self) -> None:
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._slots: dict[int, _ToolSlot] = {}
        self._last_slot: int | None = None
        self.finish_reason: str | None = None
        self.usage: Usage | None = None
        self.model: str | None = None
        self.chunks = 0

    @property
    def text(self) -> str:
        return "".join(self._text)

    @property
    def has_tool_calls(self) -> bool:
        return bool(self._slots)

    def feed(self, chunk: Mapping[str, Any]) -> list[Delta]:
        """Take one chunk; return the deltas it carried. Raises ``ModelError`` on ``error``."""
        if chunk.get("error"):
            raise error_from_payload(chunk)
        self.chunks += 1
        self._note_meta(chunk)
        deltas: list[Delta] = []
        for choice in chunk.get("choices") or ():
            if isinstance(choice, Mapping) and choice.get("index", 0) in (0, None):
                deltas.extend(self._feed_choice(choice))
        return deltas

    def result(self) -> Reply:
        calls = tuple(self._slots[i].to_call() for i in sorted(self._slots))
        return Reply(
            text=self.text,
            reasoning="".join(self._reasoning),
            tool_calls=calls,
            finish_reason=self.finish_reason,
            usage=self.usage,
            raw_model=self.model,
        )

    # -- internals

    def _note_meta(self, chunk: Mapping[str, Any]) -> None:
        if isinstance(chunk.get("model"), str) and chunk["model"]:
            self.model = chunk["model"]
        usage = chunk.get("usage")
        if not isinstance(usage, Mapping):
            x_groq = chunk.get("x_groq")
            usage = x_groq.get("usage") if isinstance(x_groq, Mapping) else None
        if isinstance(usage, Mapping):
            self.usage = usage_from_wire(usage)  # SPEC M-3: the last one wins

    def _feed_choice(self, choice: Mapping[str, Any]) -> list[Delta]:
        delta = choice.get("delta")
        if not isinstance(delta, Mapping):
            delta = choice.get("message")
        deltas = self._feed_delta(delta) if isinstance(delta, Mapping) else []
        if choice.get("finish_reason"):
            self.finish_reason = str(choice["finish_reason"])
        return deltas

    def _feed_delta(self, delta: Mapping[str, Any]) -> list[Delta]:
        deltas: list[Delta] = []
        answer, thinking = _split_content(delta.get("content"))
        reasoning = _reasoning_of(delta) + thinking
        if reasoning:
            self._reasoning.append(reasoning)
            deltas.append(Delta(kind="reasoning", text=reasoning))
        if answer:
            self._text.append(answer)
            deltas.append(Delta(kind="text", text=answer))
        for raw in delta.get("tool_calls") or ():
            if isinstance(raw, Mapping):
                deltas.extend(self._feed_tool(raw))
        legacy = delta.get("function_call")
        if isinstance(legacy, Mapping):  # SPEC M-7 function mode: one call, index 0
            deltas.extend(self._feed_tool({"index": 0, "function": legacy}))
        return deltas

    def _slot_for(self, raw: Mapping[str, Any]) -> _ToolSlot:
        index = raw.get("index")
        if not isinstance(index, int) or isinstance(index, bool):
            index = self._index_without_index(str(raw.get("id") or ""))
        slot = self._slots.get(index)
        if slot is None:
            slot = self._slots[index] = _ToolSlot(index=index)
        self._last_slot = index
        return slot

    def _index_without_index(self, call_id: str) -> int:
        """Some gateways omit ``index``: a new id opens a call, otherwise continue the last."""
        for slot in self._slots.values():
            if call_id and slot.id == call_id:
                return slot.index
        if call_id or self._last_slot is None:
            return max(self._slots, default=-1) + 1
        return self._last_slot

    def _feed_tool(self, raw: Mapping[str, Any]) -> list[Delta]:
        """SPEC M-4: first non-empty id kept; a later non-empty different name replaces the
        name, ``""`` never does; argument pieces are concatenated."""
        slot = self._slot_for(raw)
        call_id = raw.get("id")
        if isinstance(call_id, str) and call_id and not slot.id:
            slot.id = call_id
        function = raw.get("function")
        function = function if isinstance(function, Mapping) else {}
        name = function.get("name")
        renamed = isinstance(name, str) and bool(name) and name != slot.name
        if renamed:
            slot.name = str(name)
        args = function.get("arguments")
        if isinstance(args, Mapping):  # a few servers send parsed arguments
            args = json.dumps(args, ensure_ascii=False)
        piece = args if isinstance(args, str) else ""
        if piece:
            slot.pieces.append(piece)
        if not (renamed or piece):
            return []
        return [Delta(kind="tool", index=slot.index, name=slot.name or None, text=piece)]


def _with_indices(body: Mapping[str, Any]) -> dict[str, Any]:
    """A non-streaming completion, with positional ``index`` on each message tool call."""
    choices = []
    for choice in body.get("choices") or ():
        if not isinstance(choice, Mapping):
            continue
        message = dict(choice.get("message") or {})
        calls = message.get("tool_calls") or []
        message["tool_calls"] = [
            {**c, "index": c.get("index", i)} for i, c in enumerate(calls) if isinstance(c, dict)
        ]
        choices.append({**choice, "message": message})
    return {**body, "choices": choices}


def reply_from_completion(body: Mapping[str, Any]) -> tuple[Reply, list[Delta]]:
    """A non-streaming ``chat.completion`` body → ``(Reply, deltas)`` (same rules)."""
    acc = StreamAccumulator()
    deltas = acc.feed(_with_indices(body))
    return acc.result(), deltas


_RETRY_IN_TEXT = re.compile(r"retry after (\d+(?:\.\d+)?) seconds?", re.IGNORECASE)


def retry_after_in_text(message: str) -> float | None:
    """Azure writes ``Please retry after 33 seconds`` in the message (fixtures/sse/errors)."""
    match = _RETRY_IN_TEXT.search(message)
    return float(match.group(1)) if match else None
