"""The round step: ``step(...) -> StepResult(state', decision)`` — pure, no I/O.

The worker calls the model, then hands the reply here. Internal tools (set_plan,
update_plan, ask_user, stop) run inside the step; external tools come back as ``pending``
calls for the worker to fan out (SPEC L-1, L-4, L-5, L-6, P-*, A-2, N-3).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any

from shared.agent import ask as ask_mod
from shared.agent import handoff as handoff_mod
from shared.agent import kinds
from shared.agent import output as output_mod
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
    paused_call_ids,
)
from shared.agent.messages import Message, Reply, ToolCall
from shared.agent.spec import AgentSpec
from shared.agent.state import CatalogEntry, LoopState

__all__ = [
    "INTERNAL_TOOLS",
    "SKIPPED_AFTER_ASK",
    "SKIPPED_AFTER_STOP",
    "SKIPPED_WRITE_FOR_ASK",
    "SKIPPED_WRITE_FOR_STOP",
    "StepResult",
    "call_signature",
    "classify_calls",
    "next_tool_choice",
    "step",
    "stopped_at_join",
    "unique_call_ids",
]

INTERNAL_TOOLS = frozenset({"set_plan", "update_plan", "ask_user", "stop"})
SKIPPED_AFTER_ASK = (
    "Skipped: not run because the run paused for a question to the user; "
    "call it again after the answer if it is still needed."
)
SKIPPED_AFTER_STOP = "Skipped: not run because the run stopped."
SKIPPED_WRITE_FOR_ASK = (
    "Skipped: answer the question first. This write was not proposed for approval; "
    "propose it again after the answer if it is still needed."
)
SKIPPED_WRITE_FOR_STOP = "Skipped: the run stopped before this write was approved."


@dataclass(frozen=True, slots=True)
class StepResult:
    state: LoopState
    decision: Decision
    message: Message  # the assistant message to append
    plan: dict[str, Any] | None
    followups: tuple[Message, ...] = ()  # appended after it (an output repair prompt)


def unique_call_ids(reply: Reply, taken: Collection[str], round_: int) -> Reply:
    """The reply with every tool call id unique in the run. Some providers reuse ids across
    replies (a missing id becomes ``call_<index>``, SPEC M-4) or within one; a reused id
    becomes ``<id>_r<round>_<index>``, in the assistant message and the call rows alike."""
    seen = set(taken)
    calls = []
    for i, call in enumerate(reply.tool_calls):
        new_id = call.id if call.id not in seen else f"{call.id}_r{round_}_{i}"
        seen.add(new_id)
        calls.append(call if new_id == call.id else replace(call, id=new_id))
    return replace(reply, tool_calls=tuple(calls))


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
    """Mutable scratch for one classification pass (local to ``classify_calls``).

    ``then`` is set by the first halting call (a valid ``ask_user`` or ``stop``); every later
    call of the reply is skipped (L-4)."""

    plan: dict[str, Any] | None
    then: AwaitAnswer | Finish | None = None
    handoff: str | None = None  # the transfer this reply took (the first)


def classify_calls(
    spec: AgentSpec,
    calls: tuple[ToolCall, ...],
    catalog: Mapping[str, CatalogEntry],
    plan: dict[str, Any] | None,
) -> tuple[tuple[PlannedCall, ...], After, dict[str, Any] | None]:
    """Classify every call of a reply before any I/O (L-4, L-5, L-6, P-*, A-2, N-3).

    The reply-shape rules (README "Reply shapes"): calls are taken in the model's order; the
    first valid ``ask_user`` or ``stop`` halts the reply and every later call is skipped.
    Writes of a guarded agent that came before the halt are skipped too: an ask is answered
    before anything is proposed for approval, and a stopped run approves nothing. Without a
    halt, the writes wait for one approval. So every call ends ``done`` or ``pending``, except
    the calls the pause itself answers (the ask, or the approval's items)."""
    walk = _Walk(plan=plan)
    planned = tuple(_classify_one(spec, i, c, catalog, walk) for i, c in enumerate(calls))
    if walk.then is not None:
        planned = tuple(_skip_unapproved(c, walk.then) for c in planned)
        return planned, walk.then, walk.plan
    approvals = tuple(_approval_item(c) for c in planned if c.status == "waiting")
    return planned, AwaitApproval(items=approvals) if approvals else Continue(), walk.plan


def _skip_unapproved(call: PlannedCall, then: AwaitAnswer | Finish) -> PlannedCall:
    """A write waiting for approval in a reply that also asked or stopped: skipped."""
    if call.status != "waiting" or call.name == "ask_user":
        return call
    text = SKIPPED_WRITE_FOR_ASK if isinstance(then, AwaitAnswer) else SKIPPED_WRITE_FOR_STOP
    return replace(call, status="done", result=text)


def stopped_at_join(then: After, text: str = "") -> tuple[Finish, dict[str, str]]:
    """A tool of the batch asked to end the run (``ToolResult.stop``, SPEC L-6): at the join
    the run ends ``stop_tool`` whatever the round decided, and each call the pause would have
    answered gets its skip text (call id -> text), so none is left without a tool message."""
    if isinstance(then, Finish):
        return then, {}
    text_for = SKIPPED_AFTER_STOP if isinstance(then, AwaitAnswer) else SKIPPED_WRITE_FOR_STOP
    skipped = {call_id: text_for for call_id in sorted(paused_call_ids(then))}
    return Finish(stop_reason="stop_tool", text=text), skipped


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


def _read_only(call: ToolCall, catalog: Mapping[str, CatalogEntry]) -> bool:
    entry = catalog.get(call.name)
    return entry.read_only if entry is not None else True


def _classify_one(
    spec: AgentSpec,
    index: int,
    call: ToolCall,
    catalog: Mapping[str, CatalogEntry],
    walk: _Walk,
) -> PlannedCall:
    if walk.then is not None:
        text = SKIPPED_AFTER_ASK if isinstance(walk.then, AwaitAnswer) else SKIPPED_AFTER_STOP
        return _done(call, index, text, read_only=_read_only(call, catalog))
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
        reason = str(args.get("reason") or "")
        walk.then = Finish(stop_reason="stop_tool", text=reason)
        return _done(call, index, "Stopped.")
    handoff = handoff_mod.handoff_of(spec, call.name)
    if handoff is not None:  # docs/handoffs.md: the next round is the target's
        if walk.handoff is not None:
            return _done(call, index, handoff_mod.SKIPPED_SECOND_HANDOFF)
        walk.handoff = handoff.name
        return _done(call, index, handoff_mod.transfer_text(handoff))
    return _run_ask(index, call, args, walk)


def _run_ask(index: int, call: ToolCall, args: dict[str, Any], walk: _Walk) -> PlannedCall:
    parsed = ask_mod.parse_ask(args)
    if isinstance(parsed, str):
        return _done(call, index, parsed)
    ask = parsed.to_dict()
    ask["ask_id"] = call.id
    walk.then = AwaitAnswer(ask=ask)
    return PlannedCall(call.id, call.name, call.arguments, index, "waiting", True, None, args)


def _plan_obj(plan: dict[str, Any] | None) -> plan_mod.Plan | None:
    return plan_mod.Plan.from_dict(plan) if plan else None


def _output_data(spec: AgentSpec, text: str) -> dict[str, Any]:
    """``{"data": ...}`` when the text is a valid structured answer, else nothing."""
    if spec.output_schema is None:
        return {}
    data, _ = output_mod.parse_output(text, spec.output_schema)
    return {"data": data} if data is not None else {}


def _structured(
    schema: dict[str, Any],
    state: LoopState,
    text: str,
    message: Message,
    plan: dict[str, Any] | None,
) -> StepResult:
    """A final answer checked against the ``output_schema``: its data, one repair round, or
    the end with ``output_invalid``."""
    checked = output_mod.check_answer(text, schema, repaired=state.output_repairs > 0)
    if checked.data is not None:
        return StepResult(state, Finish("completed", text, {"data": checked.data}), message, plan)
    if checked.repair is not None:
        state = replace(state, output_repairs=state.output_repairs + 1)
        return StepResult(state, Continue(), message, plan, followups=(checked.repair,))
    finish = Finish(output_mod.OUTPUT_INVALID, text, {"output_error": checked.problem})
    return StepResult(state, finish, message, plan)


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
        data = _output_data(spec, reply.text)
        finish = Finish(stop_reason=state.finalizing, text=reply.text, result=data)
        return StepResult(state, finish, message, plan)
    if spec.kind in ("classify", "extract", "expand_query"):
        result = kinds.helper_result(spec, reply.text, question)
        return StepResult(state, Finish("completed", reply.text, result), message, plan)
    if spec.kind != "agent" or not reply.tool_calls:
        if spec.output_schema is not None:
            return _structured(spec.output_schema, state, reply.text, message, plan)
        return StepResult(state, Finish(stop_reason="completed", text=reply.text), message, plan)
    state = _count_rounds(state, reply)
    calls, then, new_plan = classify_calls(spec, reply.tool_calls, catalog, plan)
    state = replace(state, tool_calls=state.tool_calls + len(calls))
    state, _ = handoff_mod.taken_handoff(spec, calls, state)
    return StepResult(state, RunTools(calls=calls, then=then), message, new_plan)
