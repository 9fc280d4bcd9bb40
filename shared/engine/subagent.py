"""A sub-agent call's tool task starts its child run (``shared.engine.children``): the call
goes ``running → child`` (guarded by its attempt: exactly once) and the child run is inserted
with an id derived from ``(parent_run_id, call_id)`` (``INSERT … ON CONFLICT DO NOTHING``), its
first round dispatched — one transaction. The child's budget is its share of what the parent
has left (``_share``), reserved on the call until the child ends."""

from __future__ import annotations

import json
import logging
from typing import Any

from sqlalchemy.engine import Connection

from shared import tracing
from shared.agent.arguments import ArgumentsError, parse_arguments
from shared.agent.compression import tool_result_budget
from shared.agent.messages import Message
from shared.agent.spec import AgentSpec
from shared.agent.state import LoopState
from shared.engine.change import Change, LostRace
from shared.engine.children import child_run_id
from shared.engine.runtime import Runtime
from shared.engine.transition import attempt
from shared.engine.tx import Tx
from shared.errors import ConfigError
from shared.llm.profiles import resolve_profile
from shared.store import ancestry
from shared.store import calls as call_store
from shared.store import runs as run_store
from shared.store.rows import Call, CallStatus, Run, Status
from shared.tools.agent_tool import question_of
from shared.vocab import EventType

__all__ = ["start", "too_deep"]

log = logging.getLogger("treadle.children")


def too_deep(conn: Connection, run_id: str) -> bool:
    """Whether a run is ``MAX_DEPTH`` levels below its root (its calls start no child)."""
    return len(ancestry.ancestors(conn, run_id)) >= ancestry.MAX_DEPTH


def start(rt: Runtime, spec: AgentSpec, sub: AgentSpec, run: Run, call: Call) -> str:
    """The tool task of a sub-agent call: mark the call ``child`` and insert the child run
    with its first round, in one transaction. ``committed`` | ``lost``."""
    child_id = child_run_id(run.id, call.call_id)

    def op(tx: Tx) -> str:
        if not _mark_child(tx.conn, call, child_id, _result_budget(rt, spec)):
            raise LostRace(run.id)
        parent = run_store.lock_run(tx.conn, run.id)  # siblings start one at a time
        assert parent is not None
        budgeted, reserved = _share(tx.conn, parent, spec, call, sub)
        if reserved:
            data = {**(call.data or {}), "child_run_id": child_id, **reserved}
            call_store.set_calls(tx.conn, run.id, [call.call_id], {"data": data})
        _insert_child(tx, run, call, budgeted, child_id)
        tx.wake(run.id)
        return "committed"

    return attempt(rt, op) or "lost"


def _share(
    conn: Connection, parent: Run, spec: AgentSpec, call: Call, sub: AgentSpec
) -> tuple[AgentSpec, dict[str, float]]:
    """The child's budget: what its parent has left of ``max_cost`` and ``max_tool_calls``
    after its own spending and its other working children's reservations (the child's own
    limit, if lower). Reserved on the call until the child ends (its real cost is then added
    to the parent's), so children started together never spend more than the parent has."""
    limits = spec.budget
    if limits.max_cost is None and limits.max_tool_calls is None:
        return sub, {}
    others = [
        c.data or {}
        for c in call_store.list_tool_calls(conn, parent.id, call.round)
        if c.status == CallStatus.CHILD and c.call_id != call.call_id
    ]
    own, reserved = sub.budget, {}
    updates: dict[str, Any] = {}
    if limits.max_cost is not None:
        held = sum(float(d.get("reserved_cost", 0.0)) for d in others)
        left = max(0.0, limits.max_cost - parent.cost - held)
        updates["max_cost"] = left if own.max_cost is None else min(own.max_cost, left)
        reserved["reserved_cost"] = updates["max_cost"]
    if limits.max_tool_calls is not None:
        held_calls = sum(int(d.get("reserved_calls", 0)) for d in others)
        used = LoopState.from_dict(parent.loop).tool_calls
        left_calls = max(0, limits.max_tool_calls - used - held_calls)
        cap = left_calls if own.max_tool_calls is None else min(own.max_tool_calls, left_calls)
        updates["max_tool_calls"] = cap
        reserved["reserved_calls"] = cap
    return sub.model_copy(update={"budget": own.model_copy(update=updates)}), reserved


def _result_budget(rt: Runtime, spec: AgentSpec) -> int:
    """The parent's tool-result budget, kept on the call for the child's end."""
    try:
        window = resolve_profile(spec.model, rt.profiles).context_window
    except ConfigError:
        window = 128_000
    return tool_result_budget(window, spec.tool_result_max_tokens)


def _mark_child(conn: Connection, call: Call, child_id: str, budget: int) -> bool:
    """``running → child`` for this very attempt: the exactly-once guard of the start."""
    data = {**(call.data or {}), "child_run_id": child_id, "result_budget": budget}
    changed = call_store.set_calls(
        conn,
        call.run_id,
        [call.call_id],
        {"status": CallStatus.CHILD.value, "lease_owner": None, "data": data},
        from_status=[CallStatus.RUNNING],
        attempts=call.attempts,
    )
    return changed == 1


def _child_input(call: Call) -> str:
    try:
        args = parse_arguments(call.arguments or "{}")
    except ArgumentsError:
        return str(call.arguments)
    return question_of(args) if isinstance(args, dict) else json.dumps(args)


def _insert_child(tx: Tx, parent: Run, call: Call, sub: AgentSpec, child_id: str) -> None:
    """The child run (same tenant, the parent's deadline at the latest) and its round."""
    own = tx.ts + sub.budget.deadline_s if sub.budget.deadline_s else None
    deadlines = [d for d in (own, parent.deadline_at) if d is not None]
    row = {
        "id": child_id,
        "tenant": parent.tenant,
        "kind": sub.kind,
        "status": Status.QUEUED.value,
        "parent_run_id": parent.id,
        "parent_call_id": call.call_id,
        "deadline_at": min(deadlines) if deadlines else None,
        "spend_keys": parent.spend_keys,  # its spend counts in its root's envelopes
    }
    spec: dict[str, Any] = {
        "agent": sub.model_dump(mode="json", exclude_none=True),
        "trace": tracing.stamp_run(child_id),  # the parent's trace, under the starting call
    }
    msgs = [Message(role="user", content=_child_input(call))]
    if not tx.rt.store.insert_run(tx.conn, row, spec, msgs, tx.ts, if_absent=True):
        log.warning("child run %s of %s already existed", child_id, parent.id)
        return
    child = run_store.load_run(tx.conn, child_id)
    assert child is not None
    change = Change(child, bump=False, queue_round=True)
    change.event(
        EventType.RUN_QUEUED, kind=sub.kind, parent_run_id=parent.id, parent_call_id=call.call_id
    )
    tx.apply(change)
