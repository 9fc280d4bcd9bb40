"""The round step: ``step(...) -> StepResult(state', decision)`` — pure, no I/O.

The worker calls the model, then hands the reply here. Internal tools (set_plan,
update_plan, ask_user, stop) run inside the step; external tools come back as ``pending``
calls for the worker to fan out (SPEC L-1, L-4, L-5, L-6, P-*, A-2, N-3).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from shared.agent import ask as ask_mod
from shared.agent import kinds
from shared.agent import plan as plan_mod
from shared.agent.arguments import ArgumentsError, parse_arguments, validate_against_schema
from shared.agent.decisions import (
    After,
    AwaitAnswer,
    AwaitApproval,
    CallStatus,
    Continue,
    Decision,
    Finish,
    PlannedCall,
    RunTools,
)
from shared.agent.messages import Message, Reply, ToolCall
from shared.agent.spec import AgentSpec
from shared.agent.state import CatalogEntry, LoopState

__all__ = [
    "INTERNAL_TOOLS",
    "SKIPPED_TEXT",
    "StepResult",
    "call_signature",
    "classify_calls",
    "next_tool_choice",
    "step",
]

INTERNAL_TOOLS = frozenset({"set_plan", "update_plan", "ask_user", "stop"})
SKIPPED_TEXT = "Skipped: not run because the run paused or stopped before this call."


@dataclass(frozen=True, slots=True)
class StepResult:
    state: LoopState
    decision: Decision
    message: Message  # the assistant message to append
    plan: dict[str, Any] | None


def call_signature(calls: tuple[ToolCall, ...]) -> str:
    """Tool names and arguments of a reply, normalised (L-3 identical-round detection)."""
    norm = []
    for c in calls:
        try:
            args: Any = json.loads(c.arguments or "{}")
        except ValueError:
            args = c.arguments
        norm.append([c.name, args])
    return json.dumps(norm, sort_keys=True, ensure_ascii=False)


def _count_rounds(state: LoopState, reply: Reply) -> LoopState:
    """L-3 counters after a reply."""
    if not reply.tool_calls:
        return replace(state, tool_only_rounds=0, identical_rounds=0, last_signature=None)
    sig = call_signature(reply.tool_calls)
    identical = state.identical_rounds + 1 if sig == state.last_signature else 1
    tool_only = 0 if reply.text.strip() else state.tool_only_rounds + 1
    return replace(
        state, tool_only_rounds=tool_only, identical_rounds=identical, last_signature=sig
    )


def next_tool_choice(spec: AgentSpec, state: LoopState) -> str | None:
    """L-3: force ``none`` after too many tool-only rounds or 3 identical rounds in a row."""
    if state.finalizing:
        return "none"
    if state.tool_only_rounds > spec.force_answer_after or state.identical_rounds >= 3:
        return "none"
    return None


@dataclass
class _Walk:
    """Mutable scratch for one classification pass (local to ``classify_calls``)."""

    plan: dict[str, Any] | None
    halted: bool = False
    then: After | None = None


def classify_calls(
    spec: AgentSpec,
    calls: tuple[ToolCall, ...],
    catalog: Mapping[str, CatalogEntry],
    plan: dict[str, Any] | None,
) -> tuple[tuple[PlannedCall, ...], After, dict[str, Any] | None]:
    """Classify every call of a reply before any I/O (L-4, L-5, L-6, P-*, A-2, N-3)."""
    walk = _Walk(plan=plan)
    planned = tuple(_classify_one(spec, i, c, catalog, walk) for i, c in enumerate(calls))
    approvals = tuple(
        _approval_item(c) for c in planned if c.status == "waiting" and c.name != "ask_user"
    )
    then: After = walk.then or Continue()
    if approvals and not isinstance(then, Finish):
        then = AwaitApproval(items=approvals)
    return planned, then, walk.plan


def _approval_item(call: PlannedCall) -> dict[str, Any]:
    preview = ", ".join(
        f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in (call.args or {}).items()
    )
    return {
        "call_id": call.call_id,
        "tool": call.name,
        "arguments": call.args or {},
        "preview": f"{call.name}({preview})"[:500],
    }


def _done(call: ToolCall, index: int, text: str, read_only: bool = True) -> PlannedCall:
    return PlannedCall(call.id, call.name, call.arguments, index, "done", read_only, text)


def _classify_one(
    spec: AgentSpec,
    index: int,
    call: ToolCall,
    catalog: Mapping[str, CatalogEntry],
    walk: _Walk,
) -> PlannedCall:
    if walk.halted:
        return _done(call, index, SKIPPED_TEXT)
    entry = catalog.get(call.name)
    if entry is None:
        return _done(call, index, f"Tool not found: {call.name}")
    try:
        args = parse_arguments(call.arguments)
    except ArgumentsError as exc:
        return _done(call, index, f"Invalid arguments for {call.name}: {exc}")
    if entry.internal:
        return _run_internal(spec, index, call, args, walk)
    problem = validate_against_schema(args, entry.parameters)
    if problem:
        return _done(call, index, f"Invalid arguments for {call.name}: {problem}")
    status: CallStatus = "waiting" if spec.guarded and not entry.read_only else "pending"
    return PlannedCall(
        call.id, call.name, call.arguments, index, status, entry.read_only, None, args
    )


def _run_internal(
    spec: AgentSpec, index: int, call: ToolCall, args: dict[str, Any], walk: _Walk
) -> PlannedCall:
    if call.name == "set_plan":
        new_plan, text = plan_mod.set_plan(_plan_obj(walk.plan), args)
        walk.plan = new_plan.to_dict() if new_plan is not None else walk.plan
        return _done(call, index, text)
    if call.name == "update_plan":
        new_plan, text = plan_mod.update_plan(_plan_obj(walk.plan), args)
        walk.plan = new_plan.to_dict() if new_plan is not None else walk.plan
        return _done(call, index, text)
    if call.name == "stop":
        walk.halted = True
        reason = str(args.get("reason") or "")
        walk.then = Finish(stop_reason="stop_tool", text=reason)
        return _done(call, index, "Stopped.")
    return _run_ask(index, call, args, walk)


def _run_ask(index: int, call: ToolCall, args: dict[str, Any], walk: _Walk) -> PlannedCall:
    parsed = ask_mod.parse_ask(args)
    if isinstance(parsed, str):
        return _done(call, index, parsed)
    walk.halted = True
    ask = parsed.to_dict()
    ask["ask_id"] = call.id
    walk.then = AwaitAnswer(ask=ask)
    return PlannedCall(call.id, call.name, call.arguments, index, "waiting", True, None, args)


def _plan_obj(plan: dict[str, Any] | None) -> plan_mod.Plan | None:
    return plan_mod.Plan.from_dict(plan) if plan else None


def step(
    spec: AgentSpec,
    state: LoopState,
    reply: Reply,
    catalog: Mapping[str, CatalogEntry],
    plan: dict[str, Any] | None = None,
    call_cost: float = 0.0,
    question: str = "",
) -> StepResult:
    """One round's decision for ``kind: agent`` (and ``chat``, which finishes at once)."""
    usage = reply.usage
    state = state.add_usage(
        usage.input_tokens if usage else 0, usage.output_tokens if usage else 0, call_cost
    )
    state = replace(state, round=state.round + 1)
    if reply.text.strip():
        state = replace(state, last_text=reply.text)
    message = reply.to_message()
    if state.finalizing:
        return StepResult(
            state, Finish(stop_reason=state.finalizing, text=reply.text), message, plan
        )
    if spec.kind in ("classify", "extract", "expand_query"):
        result = kinds.helper_result(spec, reply.text, question)
        return StepResult(state, Finish("completed", reply.text, result), message, plan)
    if spec.kind != "agent" or not reply.tool_calls:
        return StepResult(state, Finish(stop_reason="completed", text=reply.text), message, plan)
    state = _count_rounds(state, reply)
    calls, then, new_plan = classify_calls(spec, reply.tool_calls, catalog, plan)
    state = replace(state, tool_calls=state.tool_calls + len(calls))
    return StepResult(state, RunTools(calls=calls, then=then), message, new_plan)
