"""Prompt-mode tool calling (SPEC M-7) for models without native tool support. Pure.

The tools are described in the system prompt and the model answers in one of two forms::

    0: <the answer>
    1: {"name": "<tool>", "arguments": {...}}

Only a prefix at the very start of the reply (after whitespace) counts: FastGPT's unanchored
match mistook "Step 1:" or "10:30" for the protocol. History is rewritten for the model: an
assistant tool call becomes ``1: {...}`` text, a tool result a user turn wrapped in
``<tool_response>`` tags, an assistant answer ``0: <text>``.

**A ``1:`` whose JSON cannot be used** still becomes a ``ToolCall`` so the loop runs its normal
error path and the model gets a tool-call error back (the loop continues):

* ``arguments`` is the raw text the model wrote after ``1:``. The text is read with the
  loop's own tolerant reader (``shared.agent.arguments.loads_tolerant``), so when it cannot
  be read here the loop cannot read it either and reports ``Invalid arguments`` for the call;
* ``name`` is the tool name salvaged from the text (``"name": "..."``) when present, else
  ``INVALID_CALL_NAME``, which no tool has, so the loop reports ``Tool not found`` (the case
  of readable JSON without a ``name``);
* ``PromptReply.error`` says what was wrong (the client puts it in ``Reply.extra``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shared.agent.arguments import loads_tolerant
from shared.agent.messages import Message, ToolCall
from shared.llm.base import ToolDef

__all__ = [
    "INVALID_CALL_NAME",
    "PromptDeltaGate",
    "PromptReply",
    "parse_prompt_reply",
    "render_call",
    "render_tool_result",
    "render_tools_prompt",
    "to_prompt_messages",
]

INVALID_CALL_NAME = "invalid_tool_call"

_PREFIX = re.compile(r"\s*([01])\s*[:：]")
_PARTIAL_PREFIX = re.compile(r"\s*[01]?\s*")
_FENCE = re.compile(r"^\s*```[a-zA-Z0-9]*\s*|\s*```\s*$")
_NAME = re.compile(r"""["']name["']\s*:\s*["']([^"']+)["']""")
_CLOSE_TAG = "</tool_response>"

_INSTRUCTIONS = """\
You can call tools. Reply in exactly one of these two forms, with nothing before the prefix:
0: <your final answer to the user>
1: {"name": "<tool name>", "arguments": {<the tool's arguments as a JSON object>}}
Use form 1 to call ONE tool. Its result comes back in a <tool_response> block; then reply again \
in one of the two forms. Call only the tools listed here.

<tools>
{tools}
</tools>"""


@dataclass(frozen=True, slots=True)
class PromptReply:
    """A parsed prompt-mode reply: an answer, or one tool call (maybe an invalid one)."""

    answer: str = ""
    call: ToolCall | None = None
    error: str | None = None


def render_tools_prompt(tools: Sequence[ToolDef]) -> str:
    """The system-prompt block that describes the tools and the 0:/1: protocol."""
    lines = [
        json.dumps(
            {"name": t.name, "description": t.description, "parameters": t.parameters},
            ensure_ascii=False,
        )
        for t in tools
    ]
    return _INSTRUCTIONS.replace("{tools}", "\n".join(lines))


def render_call(call: ToolCall) -> str:
    """An assistant tool call as prompt-mode text: ``1: {"name": ..., "arguments": ...}``."""
    try:
        arguments: Any = json.loads(call.arguments or "{}")
    except ValueError:
        arguments = call.arguments
    return "1: " + json.dumps({"name": call.name, "arguments": arguments}, ensure_ascii=False)


def render_tool_result(name: str | None, text: str) -> str:
    """A tool result as the user turn the model reads in prompt mode."""
    safe = text.replace(_CLOSE_TAG, "<\\/tool_response>")
    attr = f' name="{name}"' if name else ""
    return f"<tool_response{attr}>\n{safe}\n{_CLOSE_TAG}"


# --------------------------------------------------------------------------- history


def to_prompt_messages(messages: Sequence[Message], tools: Sequence[ToolDef]) -> list[Message]:
    """Rewrite a transcript for prompt mode; describe ``tools`` in the system prompt.

    Parallel calls from a native-mode history are linearised: each call is followed by its
    result (``1: call₁``, result₁, ``1: call₂``, result₂), so turns keep alternating.
    """
    names = {c.id: c.name for m in messages for c in m.tool_calls}
    out: list[Message] = []
    i = 0
    while i < len(messages):
        msg = messages[i]
        if msg.role == "assistant" and msg.tool_calls:
            i = _linearise_calls(messages, i, out)
            continue
        if msg.role == "tool":
            name = msg.name or names.get(msg.tool_call_id or "")
            out.append(Message(role="user", content=render_tool_result(name, msg.text)))
        elif msg.role == "assistant" and isinstance(msg.content, str) and msg.content.strip():
            out.append(Message(role="assistant", content=f"0: {msg.content}"))
        else:
            out.append(msg)
        i += 1
    return _merge_users(_with_tools_prompt(out, tools))


def _linearise_calls(messages: Sequence[Message], start: int, out: list[Message]) -> int:
    results: dict[str, Message] = {}
    end = start + 1
    while end < len(messages) and messages[end].role == "tool":
        results[messages[end].tool_call_id or f"#{end}"] = messages[end]
        end += 1
    for call in messages[start].tool_calls:
        out.append(Message(role="assistant", content=render_call(call)))
        result = results.pop(call.id, None)
        if result is not None:
            out.append(Message(role="user", content=render_tool_result(call.name, result.text)))
    for orphan in results.values():
        out.append(Message(role="user", content=render_tool_result(orphan.name, orphan.text)))
    return end


def _with_tools_prompt(messages: list[Message], tools: Sequence[ToolDef]) -> list[Message]:
    if not tools:
        return messages
    block = render_tools_prompt(tools)
    first = messages[0] if messages else None
    if first is not None and first.role == "system" and isinstance(first.content, str):
        content = f"{first.content}\n\n{block}" if first.content.strip() else block
        return [first.with_content(content), *messages[1:]]
    return [Message(role="system", content=block), *messages]


def _merge_users(messages: list[Message]) -> list[Message]:
    """Adjacent plain-text user turns become one (strict chat templates want alternation)."""
    out: list[Message] = []
    for msg in messages:
        prev = out[-1] if out else None
        if (
            prev is not None
            and prev.role == msg.role == "user"
            and isinstance(prev.content, str)
            and isinstance(msg.content, str)
        ):
            out[-1] = prev.with_content(f"{prev.content}\n\n{msg.content}")
        else:
            out.append(msg)
    return out


# --------------------------------------------------------------------------- replies


def parse_prompt_reply(text: str, call_id: str, *, tools_offered: bool = True) -> PromptReply:
    """Parse a prompt-mode reply; only an anchored ``0:``/``1:`` prefix counts.

    Without ``tools_offered`` a ``1:`` reply is plain text (e.g. a numbered list).
    """
    match = _PREFIX.match(text)
    if match is None:
        return PromptReply(answer=text.strip())
    rest = text[match.end() :].strip()
    if match.group(1) == "0" or not tools_offered:
        return PromptReply(answer=rest if match.group(1) == "0" else text.strip())
    return _parse_call(rest, call_id)


def _parse_call(rest: str, call_id: str) -> PromptReply:
    obj = _load_object(_FENCE.sub("", rest))
    if isinstance(obj, dict) and isinstance(obj.get("name"), str) and obj["name"].strip():
        arguments = obj.get("arguments", obj.get("parameters", {}))
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)
        return PromptReply(call=ToolCall(id=call_id, name=obj["name"].strip(), arguments=arguments))
    salvaged = _NAME.search(rest)
    name = salvaged.group(1).strip() if salvaged else INVALID_CALL_NAME
    error = (
        'the tool call after `1:` is not a JSON object like {"name": "<tool>", "arguments": {...}}'
    )
    return PromptReply(call=ToolCall(id=call_id, name=name, arguments=rest), error=error)


def _load_object(text: str) -> Any:
    """The loop's own tolerant reader (strict JSON, else json5 of the first balanced block),
    so a call this module gives up on is one the loop reports as ``Invalid arguments``."""
    try:
        return loads_tolerant(text)
    except ValueError:
        return None


class PromptDeltaGate:
    """Filters streamed prompt-mode text so listeners see only the answer.

    It waits for the first characters: ``0:`` → the rest streams without the prefix; ``1:``
    (with tools offered) → nothing streams (it is a call); anything else streams as it is.
    """

    def __init__(self, *, tools_offered: bool = True) -> None:
        self._tools_offered = tools_offered
        self._buffer = ""
        self._state = "undecided"  # undecided | answer | call | plain
        self._skip_space = False

    def push(self, text: str) -> str:
        """Feed streamed text; return the part to show now."""
        if self._state == "undecided":
            self._buffer += text
            return self._decide()
        if self._state == "call":
            return ""
        return self._emit(text)

    def finish(self) -> str:
        """End of stream: release what an undecided gate still holds."""
        if self._state != "undecided":
            return ""
        self._state = "plain"
        held, self._buffer = self._buffer, ""
        return held

    def _decide(self) -> str:
        match = _PREFIX.match(self._buffer)
        if match is None:
            if _PARTIAL_PREFIX.fullmatch(self._buffer):
                return ""
            self._state = "plain"
            return self._emit_buffer(0)
        if match.group(1) == "1" and self._tools_offered:
            self._state = "call"
            return ""
        if match.group(1) == "1":
            self._state = "plain"
            return self._emit_buffer(0)
        self._state, self._skip_space = "answer", True
        return self._emit_buffer(match.end())

    def _emit_buffer(self, start: int) -> str:
        held, self._buffer = self._buffer[start:], ""
        return self._emit(held)

    def _emit(self, text: str) -> str:
        if self._skip_space:
            stripped = text.lstrip()
            if stripped:
                self._skip_space = False
            return stripped
        return text
