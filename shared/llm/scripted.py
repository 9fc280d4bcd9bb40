"""Offline models: a scripted model for tests, and the ``demo`` model.

Both are stateless: the reply is chosen from the request alone (the number of assistant
messages after the last user turn), so any worker process, or a retry after a crash, picks
the same reply for the same round.
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
from shared.llm.base import Delta, DeltaSink, ModelRequest

__all__ = ["DemoModel", "ScriptedModel", "estimate_tokens", "round_index"]


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
    usage = Usage(
        input_tokens=_request_tokens(request),
        output_tokens=estimate_tokens(reply.text + reply.reasoning) + 1,
        estimated=True,
    )
    return Reply(
        text=reply.text,
        reasoning=reply.reasoning,
        tool_calls=reply.tool_calls,
        finish_reason=reply.finish_reason,
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

    def complete(self, request: ModelRequest, on_delta: DeltaSink | None = None) -> Reply:
        _log_call(self.name)
        if _is_checkpoint_request(request):
            return _with_usage(_checkpoint_reply(request), request, self.name)
        idx = min(round_index(request.messages), len(self.replies) - 1)
        spec = self.replies[idx]
        if spec.get("sleep"):
            time.sleep(float(spec["sleep"]))
        reply = _reply_from_dict(spec, idx)
        _stream(reply, on_delta)
        return _with_usage(reply, request, self.name)


_TIME_WORDS = ("time", "clock", "date", "几点", "时间")


class DemoModel:
    """The built-in offline ``demo`` model: a tiny, deterministic 'assistant'.

    With tools it calls ``current_time`` when the question mentions time and ``calculator``
    when the question holds an arithmetic expression; then it answers from the tool results.
    Without tools it answers in one reply.
    """

    name = "demo"

    def complete(self, request: ModelRequest, on_delta: DeltaSink | None = None) -> Reply:
        _log_call(self.name)
        reply = self._decide(request)
        _stream(reply, on_delta)
        return _with_usage(reply, request, self.name)

    def _decide(self, request: ModelRequest) -> Reply:
        msgs = request.messages
        question = next((m.text for m in reversed(msgs) if m.role == "user"), "")
        tool_names = {t.name for t in request.tools}
        results = [m for m in msgs if m.role == "tool" and not m.kind]  # not a thread's history
        if request.tool_choice != "none" and not results:
            calls = self._plan_calls(question, tool_names)
            if calls:
                return Reply(
                    reasoning="The question needs a tool; calling it first.",
                    tool_calls=tuple(calls),
                    finish_reason="tool_calls",
                )
        if results:
            facts = "; ".join(f"{m.name or 'tool'}: {m.text}" for m in results[-3:])
            return Reply(
                reasoning="I have the tool results; composing the answer.",
                text=f"Here is what I found. {facts}",
                finish_reason="stop",
            )
        return Reply(
            reasoning="A direct question; answering it.",
            text=f"Hello! You asked: {question.strip()[:200]}. This is treadle's offline demo "
            "model answering.",
            finish_reason="stop",
        )

    @staticmethod
    def _plan_calls(question: str, tool_names: set[str]) -> list[ToolCall]:
        calls: list[ToolCall] = []
        low = question.lower()
        if "current_time" in tool_names and any(w in low for w in _TIME_WORDS):
            calls.append(ToolCall(id="call_demo_time", name="current_time", arguments="{}"))
        expr = re.search(r"[\d.]+(?:\s*[-+*/^]\s*\(?[\d.]+\)?)+", question)
        if "calculator" in tool_names and expr:
            args = json.dumps({"expression": expr.group(0).strip()})
            calls.append(ToolCall(id="call_demo_calc", name="calculator", arguments=args))
        return calls
