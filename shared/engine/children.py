"""Sub-agents as child runs: a planning agent's hands can be other agents.

An inline tool ``{name, agent: <spec of kind agent>}`` is a ``SubAgentTool``. Its call is
dispatched like any external call (a tool task, windowed by ``parallel_tools``); the tool task,
instead of executing it, **starts a child run** in one transaction (``start``): the call goes
``running → child`` (guarded by its attempt: exactly once) and the child run is inserted with
an id derived from ``(parent_run_id, call_id)`` (``INSERT … ON CONFLICT DO NOTHING``), and its
first round is dispatched. The parent's call then holds no task, no lease and no thread: it
waits in status ``child``, counted in the parent's ``open_calls``.

Every change of a child that its parent must see passes through ``Tx.apply``
(``shared.engine.transition``), which calls ``after_change`` in the same transaction:

* **final** (completed, failed, cancelled): the child's answer (or its error) becomes the
  call's result and its cost is added to the parent's, through the same join as a tool call's
  end (``transition.finish_call``) — one transaction, so a crash leaves either the running child
  or the finished child and the joined parent.
* **waiting** (an ask or an approval in the child): the parent becomes ``waiting`` with the
  child's pending pause and ``pending.run_id`` = the run that paused (the deepest one when
  nested); nothing is dispatched. An answer or approval sent to the parent is routed to that
  run (``shared.engine.commands``); when it resumes, ``sync_parent`` returns the parent (and
  its ancestors) to ``running``, or surfaces the next waiting child.

The parent's version does not change while a child works or pauses (like a tool call's
result, these updates do not bump it), so dispatches of the parent's other calls stay valid;
the join bumps it.

**Lock order**: see ``shared.engine.transition``. ``lock_lineage`` takes, for each ancestor
root first, the call that leads down and then its runs row. The parent's next pending call is
taken with ``SKIP LOCKED`` (``repo.next_pending``), so a child's end never waits for a
sibling's commit that holds a row of the parent.

Cancel cascades: cancelling a run cancels its active children in the same transaction
(``shared.engine.commands``).
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from shared import tracing
from shared.agent.arguments import ArgumentsError, parse_arguments
from shared.agent.compression import reduce_tool_result, tool_result_budget
from shared.agent.messages import Message
from shared.agent.spec import AgentSpec, InlineTool
from shared.agent.state import LoopState
from shared.engine import cache
from shared.engine.runtime import Runtime
from shared.engine.transition import Change, Finished, LostRace, Tx, attempt, finish_call
from shared.errors import ConfigError
from shared.llm.profiles import resolve_profile
from shared.store import repo
from shared.store import threads as thread_store
from shared.store.rows import FINAL, Call, CallStatus, Run, Status
from shared.store.tables import runs, tool_calls
from shared.tools.agent_tool import question_of

__all__ = [
    "MAX_DEPTH",
    "active_children",
    "after_change",
    "charge_ancestors",
    "child_result_text",
    "child_run_id",
    "descendant_ids",
    "lock_lineage",
    "start",
    "sub_agent_of",
    "surfaced_pending",
    "sync_parent",
    "too_deep",
]

log = logging.getLogger("treadle.children")

MAX_DEPTH = 5
"""Nesting limit: a run this deep below its root does not start children."""


def child_run_id(parent_run_id: str, call_id: str) -> str:
    """The child run of a call: derived, so a retried start finds the same id."""
    digest = hashlib.sha256(f"{parent_run_id}\x00{call_id}".encode()).hexdigest()
    return f"run_{digest[:24]}"


def sub_agent_of(spec: AgentSpec, tool_name: str) -> AgentSpec | None:
    """The child spec when ``tool_name`` is a tool agent (kind agent) of ``spec``."""
    for tool in spec.tools:
        if isinstance(tool, InlineTool) and tool.name == tool_name:
            return tool.sub_agent
    return None


# --- start -------------------------------------------------------------------------------


def too_deep(conn: Connection, run_id: str) -> bool:
    """Whether a run is ``MAX_DEPTH`` levels below its root (its calls start no child)."""
    return len(_lineage(conn, run_id)) >= MAX_DEPTH


def start(rt: Runtime, spec: AgentSpec, sub: AgentSpec, run: Run, call: Call) -> str:
    """The tool task of a sub-agent call: mark the call ``child`` and insert the child run
    with its first round, in one transaction. ``committed`` | ``lost``."""
    child_id = child_run_id(run.id, call.call_id)

    def op(tx: Tx) -> str:
        if not _mark_child(tx.conn, call, child_id, _result_budget(rt, spec)):
            raise LostRace(run.id)
        parent = repo.lock_run(tx.conn, run.id)  # siblings start one at a time
        assert parent is not None
        budgeted, reserved = _share(tx.conn, parent, spec, call, sub)
        if reserved:
            data = {**(call.data or {}), "child_run_id": child_id, **reserved}
            repo.close_calls(tx.conn, run.id, [call.call_id], {"data": data})
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
        for c in repo.list_tool_calls(conn, parent.id, call.round)
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
    changed = repo.close_calls(
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
    }
    spec: dict[str, Any] = {
        "agent": sub.model_dump(mode="json", exclude_none=True),
        "trace": tracing.stamp_run(child_id),  # the parent's trace, under the starting call
    }
    msgs = [Message(role="user", content=_child_input(call))]
    if not repo.insert_run(tx.conn, row, spec, msgs, tx.ts, if_absent=True):
        log.warning("child run %s of %s already existed", child_id, parent.id)
        return
    child = repo.load_run(tx.conn, child_id)
    assert child is not None
    change = Change(child, bump=False, queue_round=True)
    change.event("run.queued", kind=sub.kind, parent_run_id=parent.id, parent_call_id=call.call_id)
    tx.apply(change)


# --- locks -------------------------------------------------------------------------------


_LINK = (runs.c.id, runs.c.parent_run_id, runs.c.parent_call_id, runs.c.thread_id)


def _lineage(conn: Connection, run_id: str) -> list[tuple[Any, str]]:
    """The run's ancestors, root first, each with the id of its call that leads down to the
    next level (unlocked reads: a run's parent and parent call never change)."""
    links: list[tuple[Any, str]] = []
    row = conn.execute(sa.select(*_LINK).where(runs.c.id == run_id)).mappings().first()
    while row is not None and row["parent_run_id"] is not None and len(links) <= MAX_DEPTH:
        parent = (
            conn.execute(sa.select(*_LINK).where(runs.c.id == row["parent_run_id"]))
            .mappings()
            .first()
        )
        if parent is None:
            break
        links.append((parent, str(row["parent_call_id"])))
        row = parent
    return list(reversed(links))


def _lock_call(conn: Connection, run_id: str, call_id: str) -> None:
    conn.execute(
        sa.select(tool_calls.c.call_id)
        .where(tool_calls.c.run_id == run_id, tool_calls.c.call_id == call_id)
        .with_for_update()
    )


def lock_lineage(tx: Tx, run_id: str, *, ending: bool) -> Run | None:
    """Take the locks a change of ``run_id`` needs before it touches any of its own rows: the
    root's thread when the change may end runs (``ending``), then for each ancestor, root
    first, its call that leads down (a tool-call row) and then its runs row. Returns the
    parent's fresh row (None: no parent)."""
    chain = _lineage(tx.conn, run_id)
    if ending and chain and chain[0][0]["thread_id"] is not None:
        thread_store.lock_thread(tx.conn, chain[0][0]["thread_id"], tx.ts)
    parent: Run | None = None
    for ancestor, call_id in chain:
        _lock_call(tx.conn, ancestor["id"], call_id)
        parent = repo.lock_run(tx.conn, ancestor["id"])
    return parent


def charge_ancestors(tx: Tx, run: Run, cost: float) -> None:
    """Add ``cost``, which ``run`` incurred after its parent saw it end (a model call stopped
    by a cancel, billed once the work stopped), to every ancestor's cost: a parent's totals
    include its children's. Takes the lineage's locks (root first) before the caller touches
    ``run``'s own row."""
    if not cost or run.parent_run_id is None:
        return
    tx.lock_lineage(run, ending=False)
    for ancestor, _call_id in _lineage(tx.conn, run.id):
        fresh = repo.load_run(tx.conn, str(ancestor["id"]))
        if fresh is not None:
            tx.apply(Change(fresh, bump=False, values={"cost": repo.Inc(cost)}))


# --- after a child's status change ---------------------------------------------------------


def after_change(tx: Tx, child: Run) -> None:
    """Called by ``Tx.apply`` after it changed a child run (its ancestors are locked)."""
    if child.status in FINAL:
        _finish_child(tx, child)
    else:
        sync_parent(tx, child)


def child_result_text(child: Run) -> str:
    """What the parent's model reads for a finished child: its answer, or why it has none."""
    if child.status == Status.COMPLETED:
        return str((child.result or {}).get("text") or "")
    if child.status == Status.FAILED:
        message = (child.error or {}).get("message") or "failed"
        return f"Tool error: the sub-agent failed: {message}"
    return "Tool error: the sub-agent run was cancelled"


def _finish_child(tx: Tx, child: Run) -> None:
    assert child.parent_run_id is not None and child.parent_call_id is not None
    parent = repo.lock_run(tx.conn, child.parent_run_id)
    if parent is None or parent.final:
        return
    call = repo.get_call(tx.conn, parent.id, child.parent_call_id)
    if call is None or call.status != CallStatus.CHILD:
        return  # the parent was cancelled: its calls were closed already
    text = child_result_text(child)
    budget = int((call.data or {}).get("result_budget") or 4096)
    done = Finished(
        text=text,
        for_model=reduce_tool_result(text, budget),
        cost=child.cost,
        event={"child_run_id": child.id},
    )
    spec = cache.spec_of(tx.conn, parent.id)
    parent = finish_call(
        tx, parent, call, done, from_status=[CallStatus.CHILD], ask_timeout_s=spec.ask_timeout_s
    )
    if parent.open_calls > 0:  # no join: the parent may now show another child's pause
        change = _pause_change(tx.conn, parent)
        if change is not None:
            tx.apply(change)


# --- pauses --------------------------------------------------------------------------------


def surfaced_pending(child: Run) -> dict[str, Any]:
    """A child's pause as its parent shows it: the same ask or approval, with ``run_id`` =
    the run that paused (the child, or the descendant the child itself surfaces)."""
    pending = dict(child.pending or {})
    pending["run_id"] = pending.get("run_id") or child.id
    return pending


def _first_waiting_child(conn: Connection, parent_id: str) -> Run | None:
    """The parent's paused child whose call is still open, in call order."""
    q = (
        sa.select(runs)
        .join(
            tool_calls,
            sa.and_(
                tool_calls.c.run_id == runs.c.parent_run_id,
                tool_calls.c.call_id == runs.c.parent_call_id,
            ),
        )
        .where(
            runs.c.parent_run_id == parent_id,
            runs.c.status == Status.WAITING.value,
            tool_calls.c.status == CallStatus.CHILD.value,
        )
        .order_by(tool_calls.c.round, tool_calls.c.idx)
        .limit(1)
    )
    row = conn.execute(q).mappings().first()
    return Run.of(row) if row is not None else None


def _pause_change(conn: Connection, parent: Run) -> Change | None:
    """How the parent's status follows its children's pauses; None = unchanged. A parent
    waits while one of its open children waits (showing the first, in call order), and runs
    again when none does. A pause of the parent's own is never touched."""
    if parent.status not in (Status.RUNNING, Status.WAITING):
        return None
    own = parent.pending or {}
    if parent.status == Status.WAITING and not own.get("run_id"):
        return None
    child = _first_waiting_child(conn, parent.id)
    change = Change(parent, bump=False)
    if child is not None:
        pending = surfaced_pending(child)
        if parent.status == Status.WAITING and own == pending:
            return None
        change.values.update(status=Status.WAITING.value, pending=pending, wake_at=None)
        change.event("run.waiting", pending=pending)
        return change
    if parent.status == Status.WAITING:
        change.values.update(status=Status.RUNNING.value, pending=None)
        change.event("run.resumed", child_run_id=own["run_id"])
        return change
    return None


def sync_parent(tx: Tx, child: Run) -> None:
    """After a child paused or resumed: bring its parent's status in line (its ancestors are
    locked). ``Tx.apply`` of the parent's change tells the grandparent in turn."""
    if child.parent_run_id is None:
        return
    parent = repo.lock_run(tx.conn, child.parent_run_id)
    if parent is None:
        return
    change = _pause_change(tx.conn, parent)
    if change is not None:
        tx.apply(change)


# --- queries -----------------------------------------------------------------------------


def active_children(conn: Connection, run_id: str) -> list[Run]:
    """The run's children that are not final, oldest first."""
    q = (
        sa.select(runs)
        .where(runs.c.parent_run_id == run_id, runs.c.status.not_in([s.value for s in FINAL]))
        .order_by(runs.c.created_at, runs.c.id)
    )
    return [Run.of(r) for r in conn.execute(q).mappings()]


def descendant_ids(conn: Connection, run_id: str) -> list[str]:
    """Every run below ``run_id`` (children, their children, …), breadth first."""
    out: list[str] = []
    level = [run_id]
    for _ in range(MAX_DEPTH + 1):
        level = list(
            conn.execute(sa.select(runs.c.id).where(runs.c.parent_run_id.in_(level))).scalars()
        )
        if not level:
            break
        out += level
    return out
