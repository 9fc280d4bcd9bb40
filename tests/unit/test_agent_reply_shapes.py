"""The reply-shape table (README "Reply shapes"): what one reply's mix of calls does.

Every row runs the pure ``step()``; the exhaustive test checks the invariant on every shape of
up to three calls: each call is answered now (``done``), by running it (``pending``), or by
the pause that waits for it — never left dangling.
"""

from __future__ import annotations

import itertools
import json

import pytest

from shared.agent import ask as ask_mod
from shared.agent import plan as plan_mod
from shared.agent.decisions import (
    AwaitAnswer,
    AwaitApproval,
    Continue,
    Finish,
    PlannedCall,
    RunTools,
    paused_call_ids,
)
from shared.agent.messages import Reply, ToolCall
from shared.agent.spec import AgentSpec
from shared.agent.state import CatalogEntry, LoopState
from shared.agent.step import (
    SKIPPED_AFTER_ASK,
    SKIPPED_AFTER_STOP,
    SKIPPED_WRITE_FOR_ASK,
    SKIPPED_WRITE_FOR_STOP,
    step,
    stopped_at_join,
    unique_call_ids,
)

_OBJ = {"type": "object", "properties": {"q": {"type": "string"}}}
CATALOG = {
    "lookup": CatalogEntry("lookup", parameters=_OBJ, read_only=True),
    "create": CatalogEntry("create", parameters=_OBJ, read_only=False),
    "stop": CatalogEntry("stop", read_only=True, internal=True),
    ask_mod.ASK_USER: CatalogEntry(ask_mod.ASK_USER, read_only=True, internal=True),
    **{
        d["name"]: CatalogEntry(d["name"], parameters=d["parameters"], internal=True)
        for d in plan_mod.TOOL_DEFS
    },
}
GUARDED = AgentSpec(kind="agent", guarded=True, plan=True, ask=True)
UNGUARDED = AgentSpec(kind="agent", plan=True, ask=True)

_ASK = {"question": "Which env?", "options": ["prod", "staging"]}
# kind letter -> (tool name, arguments)
KINDS: dict[str, tuple[str, object]] = {
    "R": ("lookup", {"q": "x"}),  # read-only tool
    "W": ("create", {"q": "x"}),  # write tool (waits for approval in a guarded agent)
    "A": (ask_mod.ASK_USER, _ASK),  # a valid ask
    "a": (ask_mod.ASK_USER, {}),  # an invalid ask (its error goes back; no pause)
    "S": ("stop", {"reason": "enough"}),
    "P": (plan_mod.SET_PLAN, {"name": "Trip", "steps": ["book"]}),
    "U": ("no_such_tool", {}),
}


def _reply(shape: str) -> Reply:
    calls = tuple(
        ToolCall(id=f"c{i}{k}", name=KINDS[k][0], arguments=json.dumps(KINDS[k][1]))
        for i, k in enumerate(shape.split())
    )
    return Reply(tool_calls=calls)


def _outcome(call: PlannedCall, then: object) -> str:
    """A short name for what happens to one call (the words of the README table)."""
    if call.status == "pending":
        return "run"
    if call.status == "waiting":
        return "ask" if isinstance(then, AwaitAnswer) else "approve"
    skips = {
        SKIPPED_AFTER_ASK: "skip",
        SKIPPED_AFTER_STOP: "skip",
        SKIPPED_WRITE_FOR_ASK: "skip:ask-first",
        SKIPPED_WRITE_FOR_STOP: "skip:stopped",
    }
    assert call.result is not None
    if call.result in skips:
        return skips[call.result]
    if call.result == "Stopped.":
        return "stopped"
    if call.result.startswith("Tool not found"):
        return "not-found"
    if call.name == plan_mod.SET_PLAN:
        return "plan"
    return "error"


_THEN = {Continue: "next round", AwaitAnswer: "wait: answer", AwaitApproval: "wait: approval"}


def _then(then: object) -> str:
    return "end: stop_tool" if isinstance(then, Finish) else _THEN[type(then)]


def _run(spec: AgentSpec, shape: str) -> tuple[RunTools, dict[str, object] | None]:
    result = step(spec, LoopState(), _reply(shape), CATALOG)
    assert isinstance(result.decision, RunTools)
    return result.decision, result.plan


# (reply, per-call outcome, what the run does after the batch); guarded agent with plan + ask.
TABLE = [
    ("R", "run", "next round"),
    ("W", "approve", "wait: approval"),
    ("A", "ask", "wait: answer"),
    ("a", "error", "next round"),
    ("S", "stopped", "end: stop_tool"),
    ("P", "plan", "next round"),
    ("U", "not-found", "next round"),
    ("R W", "run approve", "wait: approval"),
    ("W R", "approve run", "wait: approval"),
    ("W W", "approve approve", "wait: approval"),
    ("R A", "run ask", "wait: answer"),
    ("A R", "ask skip", "wait: answer"),
    ("R S", "run stopped", "end: stop_tool"),
    ("S R", "stopped skip", "end: stop_tool"),
    ("W A", "skip:ask-first ask", "wait: answer"),
    ("A W", "ask skip", "wait: answer"),
    ("W S", "skip:stopped stopped", "end: stop_tool"),
    ("S W", "stopped skip", "end: stop_tool"),
    ("W a", "approve error", "wait: approval"),
    ("a W", "error approve", "wait: approval"),
    ("W P", "approve plan", "wait: approval"),
    ("P W", "plan approve", "wait: approval"),
    ("W U", "approve not-found", "wait: approval"),
    ("U W", "not-found approve", "wait: approval"),
    ("A S", "ask skip", "wait: answer"),
    ("S A", "stopped skip", "end: stop_tool"),
    ("A A", "ask skip", "wait: answer"),
    ("S S", "stopped skip", "end: stop_tool"),
    ("P A", "plan ask", "wait: answer"),
    ("A P", "ask skip", "wait: answer"),
    ("P S", "plan stopped", "end: stop_tool"),
    ("S P", "stopped skip", "end: stop_tool"),
    ("R P", "run plan", "next round"),
    ("P R", "plan run", "next round"),
    ("R U", "run not-found", "next round"),
    ("U R", "not-found run", "next round"),
    ("U A", "not-found ask", "wait: answer"),
    ("A U", "ask skip", "wait: answer"),
    ("U S", "not-found stopped", "end: stop_tool"),
    ("S U", "stopped skip", "end: stop_tool"),
    ("R W A", "run skip:ask-first ask", "wait: answer"),
    ("W R S", "skip:stopped run stopped", "end: stop_tool"),
    ("R W A W", "run skip:ask-first ask skip", "wait: answer"),
]


@pytest.mark.parametrize(("shape", "outcomes", "after"), TABLE, ids=[r[0] for r in TABLE])
def test_reply_shape_table_guarded(shape: str, outcomes: str, after: str) -> None:
    decision, _ = _run(GUARDED, shape)
    assert [_outcome(c, decision.then) for c in decision.calls] == outcomes.split()
    assert _then(decision.then) == after


# An unguarded agent has no approvals: a write is just a tool that runs.
UNGUARDED_TABLE = [
    ("W", "run", "next round"),
    ("W A", "run ask", "wait: answer"),
    ("A W", "ask skip", "wait: answer"),
    ("W S", "run stopped", "end: stop_tool"),
    ("S W", "stopped skip", "end: stop_tool"),
]


@pytest.mark.parametrize(
    ("shape", "outcomes", "after"), UNGUARDED_TABLE, ids=[r[0] for r in UNGUARDED_TABLE]
)
def test_reply_shape_table_unguarded(shape: str, outcomes: str, after: str) -> None:
    decision, _ = _run(UNGUARDED, shape)
    assert [_outcome(c, decision.then) for c in decision.calls] == outcomes.split()
    assert _then(decision.then) == after


def test_the_ask_with_writes_pauses_on_the_ask_and_proposes_nothing() -> None:
    decision, _ = _run(GUARDED, "W A")
    assert isinstance(decision.then, AwaitAnswer)
    assert decision.then.ask["ask_id"] == "c1A"
    assert decision.calls[0].result == SKIPPED_WRITE_FOR_ASK
    assert decision.calls[0].read_only is False  # still recorded as the write it was


def test_a_skipped_plan_call_leaves_the_plan_alone() -> None:
    _, plan = _run(GUARDED, "A P")
    assert plan is None
    _, plan = _run(GUARDED, "P A")
    assert plan is not None and plan["name"] == "Trip"


def test_a_stop_reason_becomes_the_result_text() -> None:
    decision, _ = _run(GUARDED, "W S")
    assert decision.then == Finish(stop_reason="stop_tool", text="enough")


SHAPES = [" ".join(p) for n in (1, 2, 3) for p in itertools.product(sorted(KINDS), repeat=n)]


@pytest.mark.parametrize("spec", [GUARDED, UNGUARDED], ids=["guarded", "unguarded"])
def test_every_call_is_answered_whatever_the_shape(spec: AgentSpec) -> None:
    # the invariant, over every shape of up to three calls (7 + 49 + 343 replies)
    for shape in SHAPES:
        decision, _ = _run(spec, shape)
        waiting = {c.call_id for c in decision.calls if c.status == "waiting"}
        assert waiting == paused_call_ids(decision.then), shape
        for c in decision.calls:
            assert c.status in ("pending", "done", "waiting"), shape
            assert (c.result is not None) == (c.status == "done"), shape
        first = next((i for i, k in enumerate(shape.split()) if k in ("A", "S")), None)
        if first is not None:  # nothing after the first halting call runs or waits
            later = decision.calls[first + 1 :]
            assert all((c.result or "").startswith("Skipped: ") for c in later), shape


def test_a_decision_that_leaves_a_call_dangling_is_refused() -> None:
    waiting = PlannedCall("c1", "create", "{}", 0, "waiting", False)
    with pytest.raises(ValueError, match="do not match the pause"):
        RunTools(calls=(waiting,), then=Continue())
    with pytest.raises(ValueError, match="do not match the pause"):
        RunTools(calls=(waiting,), then=Finish(stop_reason="stop_tool"))
    RunTools(calls=(waiting,), then=AwaitApproval(items=({"call_id": "c1"},)))


@pytest.mark.parametrize(
    ("shape", "skipped"),
    [
        ("R", {}),
        ("R A", {"c1A": SKIPPED_AFTER_STOP}),
        ("R W W", {"c1W": SKIPPED_WRITE_FOR_STOP, "c2W": SKIPPED_WRITE_FOR_STOP}),
    ],
)
def test_a_tool_that_stops_ends_the_run_at_the_join(shape: str, skipped: dict[str, str]) -> None:
    # the read R returned ToolResult(stop=True) (a plugin, or Treadle-Stop: true over HTTP)
    decision, _ = _run(GUARDED, shape)
    finish, texts = stopped_at_join(decision.then, "done here")
    assert finish == Finish(stop_reason="stop_tool", text="done here")
    assert texts == skipped


def test_a_stop_at_the_join_keeps_a_finish_already_decided() -> None:
    decision, _ = _run(GUARDED, "R S")
    assert stopped_at_join(decision.then, "ignored") == (decision.then, {})


def test_reused_call_ids_are_made_unique() -> None:
    # a provider that numbers calls per reply: round 2 repeats round 1's ids, and one twice
    reply = Reply(
        tool_calls=(
            ToolCall("call_0", "lookup"),
            ToolCall("call_1", "lookup"),
            ToolCall("call_1", "lookup"),
        )
    )
    fixed = unique_call_ids(reply, taken={"call_0"}, round_=2)
    assert [c.id for c in fixed.tool_calls] == ["call_0_r2_0", "call_1", "call_1_r2_2"]
    assert unique_call_ids(reply, taken=(), round_=1).tool_calls[:2] == reply.tool_calls[:2]
    assert fixed.to_message().tool_calls == fixed.tool_calls
