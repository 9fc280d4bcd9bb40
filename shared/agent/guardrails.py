"""Guardrails (docs/guardrails.md): the pure decisions. Which guardrails are still to run, the
helper-model check's prompt and how its reply is read, a rule's verdict, what a tripwire ends
the run with. The engine (``shared.engine.guardrails``) makes the calls and the commits."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from shared.agent.decisions import Finish
from shared.agent.helpers import classify_messages, classify_result
from shared.agent.messages import Message
from shared.agent.output import parse_output
from shared.agent.spec import (
    AgentSpec,
    GuardrailModelCheck,
    GuardrailRule,
    GuardrailSpec,
    regex_window,
)
from shared.agent.state import LoopState

__all__ = [
    "GUARDRAIL_STOP",
    "MAX_CHECKED_CHARS",
    "Stage",
    "Trip",
    "check_messages",
    "check_rule",
    "model_verdict",
    "passed_key",
    "pending_input",
    "tool_call_text",
    "tripped_finish",
    "with_passed",
]

GUARDRAIL_STOP = "guardrail"
"""The ``stop_reason`` of a run a guardrail ended."""
MAX_CHECKED_CHARS = 100_000
"""What a guardrail sees of a text: its first characters."""

Stage = Literal["input", "output", "tool_call"]


@dataclass(frozen=True, slots=True)
class Trip:
    """A guardrail that fired: its name, why, and where (the input, the answer, a call)."""

    name: str
    reason: str
    stage: Stage
    kind: str

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "reason": self.reason, "stage": self.stage, "kind": self.kind}


def passed_key(stage: Stage, index: int, name: str) -> str:
    """How the loop state records a passed guardrail (a re-run round does not run it again):
    its list, its place there and its name (names need not be unique)."""
    return f"{stage}:{index}:{name}"


def pending_input(spec: AgentSpec, state: LoopState, *, parallel: bool) -> list[GuardrailSpec]:
    """The input guardrails still to run before the run's first model call (none after it):
    those with ``parallel`` as given."""
    if state.round > 0:
        return []
    done = set(state.guardrails_passed)
    return [
        g
        for i, g in enumerate(spec.input_guardrails)
        if g.parallel == parallel and passed_key("input", i, g.name) not in done
    ]


def with_passed(state: LoopState, spec: AgentSpec, passed: Sequence[GuardrailSpec]) -> LoopState:
    """``state`` recording these input guardrails (of ``spec``) as passed."""
    keys = [
        passed_key("input", i, g.name)
        for i, g in enumerate(spec.input_guardrails)
        if any(g is p for p in passed)
    ]
    new = [k for k in keys if k not in state.guardrails_passed]
    if not new:
        return state
    return state.with_guardrails((*state.guardrails_passed, *new))


def _clip(text: str) -> str:
    return text[:MAX_CHECKED_CHARS]


def check_rule(rule: GuardrailRule, text: str) -> str | None:
    """Why ``text`` trips ``rule``, or None."""
    text = _clip(text)
    if rule.regex is not None:
        flags = re.IGNORECASE if rule.ignore_case else 0
        found = re.search(rule.regex, text[: regex_window(rule.regex)], flags)
        if rule.trip_when == "match" and found is not None:
            return f"the text matches the rule's pattern (at {found.start()})"
        if rule.trip_when == "no_match" and found is None:
            return "the text does not match the rule's pattern"
        return None
    assert rule.json_schema is not None
    _, problem = parse_output(text, rule.json_schema)
    return problem or None


def check_messages(check: GuardrailModelCheck, text: str) -> list[Message]:
    """The helper model's classify call for ``text`` (SPEC H-1's prompt, the guardrail's
    instructions as its background)."""
    return classify_messages(_clip(text), check.as_categories, background=check.instructions)


def model_verdict(check: GuardrailModelCheck, reply_text: str) -> str | None:
    """Why the helper model's reply trips the check (its category is one of ``trip_on``), or
    None."""
    result = classify_result(reply_text, check.as_categories)
    category = str(result["category"])
    if category not in check.trip_on:
        return None
    reason = result.get("reason")
    return f"classified as {category}" + (f": {reason}" if reason else "")


def tool_call_text(name: str, arguments: str) -> str:
    """What an output guardrail with ``tool_calls`` checks of one call."""
    return json.dumps({"tool": name, "arguments": arguments}, ensure_ascii=False)


def tripped_finish(trip: Trip) -> Finish:
    """What a tripwire ends the run with: no answer text (an output guardrail withheld it),
    the guardrail's name and reason in the result."""
    return Finish(stop_reason=GUARDRAIL_STOP, text="", result={"guardrail": trip.as_dict()})
