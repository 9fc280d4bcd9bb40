"""Offline models: a scripted model for tests, and the ``demo`` model.

Both are stateless: the reply is chosen from the request alone (the number of assistant
messages after the last user turn), so any worker process, or a retry after a crash, picks
the same reply for the same round. Both are strict like OpenAI: a request with an assistant
tool call left without its tool message fails with a fatal 400 (``shared.llm.wire_check``).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Sequence
from typing import Any

from shared.agent.compression import CHECKPOINT_KIND, CHECKPOINT_SYSTEM_PROMPT
from shared.agent.messages import Message, Reply, ToolCall, Usage
from shared.agent.tokens import estimate_tokens
from shared.errors import FatalModelError
from shared.llm.abort import Abort
from shared.llm.base import Delta, DeltaSink, ModelRequest
from shared.llm.demo import demo_reply
from shared.llm.wire_check import transcript_problem

__all__ = ["DemoModel", "ScriptedModel", "check_transcript", "round_index"]


def _request_tokens(request: ModelRequest) -> int:
    return sum(estimate_tokens(m.text) + 4 for m in request.messages)


_ROUNDS_MARK = re.compile(r"scripted-rounds=(\d+)")


def round_index(messages: Sequence[Message]) -> int:
    """How many assistant turns the run already made (the scripted reply to give next).

    Rounds summarized into a context checkpoint are carried in it as ``scripted-rounds=N``.
    """
    before = max(
        (
            int(x)
            for m in messages
            if m.kind == CHECKPOINT_KIND
            for x in _ROUNDS_MARK.findall(m.text)
        ),
        default=0,
    )
    return before + sum(1 for m in messages if m.role == "assistant" and not m.kind)


def _is_checkpoint_request(request: ModelRequest) -> bool:
    first = request.messages[0] if request.messages else None
    return first is not None and first.role == "system" and first.text == CHECKPOINT_SYSTEM_PROMPT


def _checkpoint_reply(request: ModelRequest) -> Reply:
    """A scripted summary that remembers how many rounds it covers."""
    transcript = request.messages[-1].text
    earlier = max((int(x) for x in _ROUNDS_MARK.findall(transcript)), default=0)
    rounds = earlier + transcript.count("[assistant]")
    text = (
        f"<context_checkpoint>Work so far (scripted). scripted-rounds={rounds}</context_checkpoint>"
    )
    return Reply(text=text, finish_reason="stop")


def check_transcript(request: ModelRequest) -> None:
    """Refuse, as a strict provider does, a transcript with a dangling tool call or an orphan
    tool message (only what would be sent is checked: SPEC M-5 drops blank turns)."""
    problem = transcript_problem([m.to_wire() for m in request.messages if not m.droppable])
    if problem is not None:
        raise FatalModelError(problem[1], status=400)


def _log_call(name: str) -> None:
    path = os.environ.get("TREADLE_MODEL_CALL_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(f"{name} {os.getpid()} {time.time():.6f}\n")


def _reply_from_dict(d: dict[str, Any], idx: int) -> Reply:
    calls = tuple(
        ToolCall(
            id=str(c.get("id") or f"call_{idx}_{i}"),
            name=str(c["name"]),
            arguments=c["arguments"]
            if isinstance(c.get("arguments"), str)
            else json.dumps(c.get("arguments") or {}),
        )
        for i, c in enumerate(d.get("tool_calls") or [])
    )
    return Reply(
        text=str(d.get("text", "")),
        reasoning=str(d.get("reasoning", "")),
        tool_calls=calls,
        finish_reason="tool_calls" if calls else "stop",
    )


def _with_usage(reply: Reply, request: ModelRequest, name: str) -> Reply:
    """The reply with its usage; like a provider, never more output than ``max_tokens``
    (the text is cut, ``finish_reason: length``)."""
    output = estimate_tokens(reply.text + reply.reasoning) + 1
    text, finish = reply.text, reply.finish_reason
    if request.max_tokens is not None and output > request.max_tokens:
        output = request.max_tokens
        text, finish = text[: max(0, 4 * (output - 1) - len(reply.reasoning))], "length"
    usage = Usage(input_tokens=_request_tokens(request), output_tokens=output, estimated=True)
    return Reply(
        text=text,
        reasoning=reply.reasoning,
        tool_calls=reply.tool_calls,
        finish_reason=finish,
        usage=usage,
        raw_model=name,
    )


def _stream(reply: Reply, on_delta: DeltaSink | None, delay: float = 0.0) -> None:
    if on_delta is None:
        return
    for kind, text in (("reasoning", reply.reasoning), ("text", reply.text)):
        for piece in re.findall(r"\S+\s*|\s+", text):
            on_delta(Delta(kind=kind, text=piece))  # type: ignore[arg-type]
            if delay:
                time.sleep(delay)
    for i, call in enumerate(reply.tool_calls):
        on_delta(Delta(kind="tool", index=i, name=call.name, text=call.arguments))


class ScriptedModel:
    """Replies from a list, by round: ``replies[round_index(messages)]``.

    Each reply is ``{"text", "reasoning", "tool_calls": [{"id", "name", "arguments"}]}``.
    Past the end, the last reply repeats.
    """

    def __init__(self, replies: Sequence[dict[str, Any]], name: str = "scripted") -> None:
        if not replies:
            raise ValueError("a scripted model needs at least one reply")
        self.replies = list(replies)
        self.name = name

    def complete(
        self, request: ModelRequest, on_delta: DeltaSink | None = None, abort: Abort | None = None
    ) -> Reply:
        _log_call(self.name)
        check_transcript(request)
        if _is_checkpoint_request(request):
            return _with_usage(_checkpoint_reply(request), request, self.name)
        idx = min(round_index(request.messages), len(self.replies) - 1)
        spec = self.replies[idx]
        if spec.get("sleep"):
            (abort or Abort()).wait(float(spec["sleep"]))  # a stalled provider, interruptible
        reply = _reply_from_dict(spec, idx)
        _stream(reply, on_delta)
        return _with_usage(reply, request, self.name)


class DemoModel:
    """The built-in offline ``demo`` model: deterministic replies that show every feature
    (plans, asks, tools, writes for approval, the helper kinds; see ``shared.llm.demo``)."""

    name = "demo"

    def complete(
        self, request: ModelRequest, on_delta: DeltaSink | None = None, abort: Abort | None = None
    ) -> Reply:
        _log_call(self.name)
        if abort is not None:
            abort.check()
        check_transcript(request)
        reply = demo_reply(request)
        _stream(reply, on_delta)
        return _with_usage(reply, request, self.name)
