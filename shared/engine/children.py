"""Sub-agents as child runs (seed 000 §3.3.5: a planning agent's hands are other agents).

An inline tool ``{name, agent: <spec of kind agent>}`` is a ``SubAgentTool``. Its call is
dispatched like any external call (a ``treadle.tool`` message, windowed by ``parallel_tools``);
the tool task, instead of executing it, **starts a child run** in one transaction: the call's
row goes ``running → child`` (guarded by its attempt: exactly once) and the child run is
inserted with an id derived from ``(parent_run_id, call_id)`` by ``INSERT … ON CONFLICT DO
NOTHING``, with its first round's outbox row. The parent's call then holds no task, no lease
and no thread: it waits in status ``child``, counted in the parent's ``open_calls``.

The child's status changes that the parent must see all pass through
``shared.engine.threads.apply_final`` (every transition to a final status or to ``waiting``
does), which calls ``after_change`` in the same transaction:

* **final** (completed, failed, cancelled): the child's answer (or its error) becomes the
  call's result, its cost is added to the parent's, ``open_calls`` is decremented, the next
  call of a windowed batch is queued, and whoever brings ``open_calls`` to 0 joins (flushes
  the tool messages in call order and settles ``after_join``) — one transaction, so a crash
  leaves either the running child or the finished child and the joined parent.
* **waiting** (an ask or an approval in the child): the parent becomes ``waiting`` with the
  child's pending pause and ``pending.run_id`` = the run that paused (the deepest one when
  nested); nothing is queued. An answer or approval sent to the parent is routed to that run
  (``shared.engine.commands``); when it resumes, ``sync_parent`` returns the parent (and its
  ancestors) to ``running``, or surfaces the next waiting child.

The parent's version does not change while a child works or pauses (like a tool call's
result, these updates do not bump it), so in-flight messages of the parent's other calls
stay valid; the join bumps it.

**Lock order** (PostgreSQL; SQLite serializes writers): the root run's thread (when a run may
end), then run by run top-down — the root, …, the parent, the child — and within one run its
tool-call rows before its runs row (the order a tool commit and a cancel already take them
in). Every transaction that changes a child in a way its ancestors see locks its lineage
first (``lock_lineage``: for each ancestor, the call leading down, then its runs row):
``apply_final`` does it before the child's update; paths that touch a child's rows before
calling it (a tool commit whose join ends or pauses the run, cancel, ask expiry, answer,
approval) call it at their start. The parent's next pending call is taken with ``SKIP
LOCKED`` (``afters.next_pending``), so a child's end never waits for a sibling's commit that
holds a row of the parent. A test races four child ends and a cancel on PostgreSQL.

Cancel cascades: cancelling a run cancels its active children in the same transaction
(``shared.engine.commands``).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, RowMapping

from shared.agent.arguments import ArgumentsError, parse_arguments
from shared.agent.compression import reduce_tool_result, tool_result_budget
from shared.agent.messages import Message
from shared.agent.spec import AgentSpec, InlineTool
from shared.engine import afters, cache
from shared.engine.runtime import OutboxItem, Runtime
from shared.errors import ConfigError
from shared.llm.profiles import resolve_profile
from shared.store import repo
from shared.store import threads as thread_store
from shared.store.tables import runs, tool_calls
from shared.tools.agent_tool import question_of

__all__ = [
    "CHILD",
    "MAX_DEPTH",
    "active_children",
    "after_change",
    "child_result_text",
    "child_run_id",
    "descendant_ids",
    "lock_lineage",
    "propagates",
    "start_child",
    "sub_agent_of",
    "surfaced_pending",
    "sync_parent",
    "too_deep",
]

log = logging.getLogger("treadle.children")

CHILD = "child"
"""``tool_calls.status`` of a call whose child run is working (no task, no lease)."""
MAX_DEPTH = 5
"""Nesting limit: a run this deep below its root does not start children."""
FINAL = frozenset({"completed", "failed", "cancelled"})


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


def propagates(status: Any) -> bool:
    """Whether a run moving to ``status`` must tell its parent (final, or a pause)."""
    return status in FINAL or status == "waiting"


# --- start -------------------------------------------------------------------------------


class _Lost(Exception):
    """The call moved on (cancelled, or another attempt started it): roll back."""


def too_deep(conn: Connection, run_id: str) -> bool:
    """Whether a run is ``MAX_DEPTH`` levels below its root (its calls start no child)."""
    return len(_lineage(conn, run_id)) >= MAX_DEPTH


def start_child(
    rt: Runtime, spec: AgentSpec, sub: AgentSpec, run: RowMapping, call: RowMapping,
    outbox_id: int | None,
) -> str:
    """The tool task of a sub-agent call: mark the call ``child`` and insert the child run
    with its first round message, in one transaction. ``committed`` | ``lost``."""
    ts = repo.now()
    child_id = child_run_id(run["id"], call["call_id"])
    try:
        with rt.engine.begin() as conn:
            if not _mark_child(conn, call, child_id, _result_budget(rt, spec)):
                raise _Lost
            items = _insert_child(rt, conn, run, call, sub, child_id, ts)
            repo.delete_outbox(conn, outbox_id)
    except _Lost:
        return "lost"
    rt.publish(items)
    rt.wake(run["id"])
    return "committed"


def _result_budget(rt: Runtime, spec: AgentSpec) -> int:
    """The parent's tool-result budget (SPEC L-7), kept on the call for the child's end."""
    try:
        window = resolve_profile(spec.model, rt.profiles).context_window
    except ConfigError:
        window = 128_000
    return tool_result_budget(window, spec.tool_result_max_tokens)


def _mark_child(conn: Connection, call: RowMapping, child_id: str, budget: int) -> bool:
    """``running → child`` for this very attempt: the exactly-once guard of the start."""
    data = {**(call["data"] or {}), "child_run_id": child_id, "result_budget": budget}
    done = conn.execute(
        sa.update(tool_calls)
        .where(tool_calls.c.run_id == call["run_id"], tool_calls.c.call_id == call["call_id"],
               tool_calls.c.status == "running", tool_calls.c.attempts == call["attempts"])
        .values(status=CHILD, lease_until=None, data=data)
    ).rowcount
    return bool(done == 1)


def _child_input(call: RowMapping) -> str:
    try:
        args = parse_arguments(call["arguments"] or "{}")
    except ArgumentsError:
        return str(call["arguments"])
    return question_of(args) if isinstance(args, dict) else json.dumps(args)


def _insert_child(
    rt: Runtime, conn: Connection, parent: RowMapping, call: RowMapping, sub: AgentSpec,
    child_id: str, ts: float,
) -> list[OutboxItem]:
    """The child run (same tenant, the parent's deadline at the latest) and its round."""
    own = ts + sub.budget.deadline_s if sub.budget.deadline_s else None
    deadlines = [d for d in (own, parent["deadline_at"]) if d is not None]
    row = {
        "id": child_id, "tenant": parent["tenant"], "kind": sub.kind,
        "agent": sub.model_dump(mode="json", exclude_none=True), "status": "queued",
        "parent_run_id": parent["id"], "parent_call_id": call["call_id"],
        "deadline_at": min(deadlines) if deadlines else None,
    }
    msgs = [Message(role="user", content=_child_input(call))]
    if not repo.insert_run(conn, row, msgs, ts, if_absent=True):
        log.warning("child run %s of %s already existed", child_id, parent["id"])
        return []
    changes = repo.Changes(bump_version=False)
    changes.event("run.queued", kind=sub.kind, parent_run_id=parent["id"],
                  parent_call_id=call["call_id"])
    changes.outbox.append(("round", {}))
    applied = repo.apply(conn, child_id, 0, changes, redrive_after=rt.settings.redrive_seconds,
                         ts=ts)
    return applied.outbox_ids if applied is not None else []


# --- locks -------------------------------------------------------------------------------


_LINK = (runs.c.id, runs.c.parent_run_id, runs.c.parent_call_id, runs.c.thread_id)


def _lineage(conn: Connection, run_id: str) -> list[tuple[RowMapping, str]]:
    """The run's ancestors, root first, each with the id of its call that leads down to the
    next level (unlocked reads: a run's parent and parent call never change)."""
    links: list[tuple[RowMapping, str]] = []
    row = conn.execute(sa.select(*_LINK).where(runs.c.id == run_id)).mappings().first()
    while row is not None and row["parent_run_id"] is not None and len(links) <= MAX_DEPTH:
        parent = conn.execute(
            sa.select(*_LINK).where(runs.c.id == row["parent_run_id"])).mappings().first()
        if parent is None:
            break
        links.append((parent, str(row["parent_call_id"])))
        row = parent
    return list(reversed(links))


def _lock_row(conn: Connection, run_id: str) -> RowMapping | None:
    return conn.execute(
        sa.select(runs).where(runs.c.id == run_id).with_for_update()
    ).mappings().first()


def _lock_call(conn: Connection, run_id: str, call_id: str) -> None:
    conn.execute(sa.select(tool_calls.c.call_id)
                 .where(tool_calls.c.run_id == run_id, tool_calls.c.call_id == call_id)
                 .with_for_update())


def lock_lineage(conn: Connection, run_id: str, *, ts: float, ending: bool) -> RowMapping | None:
    """Take the locks a change of ``run_id`` needs before it touches any of its own rows: the
    root's thread when the change may end runs (``ending``), then for each ancestor, root
    first, its call that leads down (a tool-call row) and then its runs row — the order every
    transaction takes a run's rows in (tool calls, then the run). Returns the parent's fresh
    row (None: no parent)."""
    chain = _lineage(conn, run_id)
    if ending and chain and chain[0][0]["thread_id"] is not None:
        thread_store.lock_thread(conn, chain[0][0]["thread_id"], ts)
    parent: RowMapping | None = None
    for ancestor, call_id in chain:
        _lock_call(conn, ancestor["id"], call_id)
        parent = _lock_row(conn, ancestor["id"])
    return parent


# --- after a child's status change ---------------------------------------------------------


def after_change(
    conn: Connection, child: RowMapping, *, redrive_after: float, ts: float
) -> list[OutboxItem]:
    """Called by ``apply_final`` after it changed a child run (its ancestors are locked)."""
    if child["parent_run_id"] is None:
        return []
    if child["status"] in FINAL:
        return _finish_child(conn, child, redrive_after=redrive_after, ts=ts)
    if child["status"] == "waiting":
        return sync_parent(conn, child, redrive_after=redrive_after, ts=ts)
    return []


def child_result_text(child: Mapping[Any, Any]) -> str:
    """What the parent's model reads for a finished child: its answer, or why it has none."""
    status = child["status"]
    if status == "completed":
        return str((child["result"] or {}).get("text") or "")
    if status == "failed":
        message = (child["error"] or {}).get("message") or "failed"
        return f"Tool error: the sub-agent failed: {message}"
    return "Tool error: the sub-agent run was cancelled"


def _close_call(conn: Connection, child: RowMapping, text: str, ts: float) -> RowMapping | None:
    """``child → done`` with the child's answer and cost; None when the call is no longer
    waiting on the child (the parent was cancelled: its calls were closed already)."""
    call = conn.execute(
        sa.select(tool_calls).where(tool_calls.c.run_id == child["parent_run_id"],
                                    tool_calls.c.call_id == child["parent_call_id"])
    ).mappings().first()
    if call is None or call["status"] != CHILD:
        return None
    budget = int((call["data"] or {}).get("result_budget") or 4096)
    conn.execute(
        sa.update(tool_calls)
        .where(tool_calls.c.run_id == call["run_id"], tool_calls.c.call_id == call["call_id"],
               tool_calls.c.status == CHILD)
        .values(status="done", result=text, result_for_model=reduce_tool_result(text, budget),
                cost=child["cost"], finished_at=ts)
    )
    return call


def _finish_child(
    conn: Connection, child: RowMapping, *, redrive_after: float, ts: float
) -> list[OutboxItem]:
    parent = _lock_row(conn, child["parent_run_id"])
    if parent is None or parent["status"] in FINAL:
        return []
    text = child_result_text(child)
    call = _close_call(conn, child, text, ts)
    if call is None:
        return []
    changes = repo.Changes(bump_version=False)
    changes.values.update(open_calls=runs.c.open_calls - 1, cost=runs.c.cost + child["cost"])
    changes.event("tool.finished", call_id=call["call_id"], name=call["name"],
                  preview=text[:300], cost=child["cost"], child_run_id=child["id"])
    nxt = afters.next_pending(conn, parent["id"], call["round"])
    if nxt is not None:
        changes.outbox.append(("tool", {"call_id": nxt}))
    paused = _pause_delta(conn, parent) if parent["open_calls"] > 1 else None
    if paused is not None:
        _add_delta(changes, paused)
    applied = repo.apply(conn, parent["id"], parent["version"], changes,
                         redrive_after=redrive_after, ts=ts)
    if applied is None:  # cannot happen under the row lock; never lose the child's end
        raise RuntimeError(f"parent {parent['id']} changed under its lock")
    items = list(applied.outbox_ids)
    if applied.row["open_calls"] == 0:
        items += _join(conn, applied.row, call["round"], redrive_after=redrive_after, ts=ts)
    elif paused is not None:
        items += sync_parent(conn, applied.row, redrive_after=redrive_after, ts=ts)
    return items


def _join(
    conn: Connection, parent: RowMapping, round_: int, *, redrive_after: float, ts: float
) -> list[OutboxItem]:
    """The child was the batch's last open call: the parent's join (which may end, pause or
    continue the parent, and so reach the grandparent through ``apply_final`` again)."""
    from shared.engine.threads import apply_final  # threads calls this module: no cycle

    spec = cache.spec_of(parent)
    changes = afters.join_changes(conn, parent, round_, ts, spec.ask_timeout_s)
    joined = apply_final(conn, parent["id"], parent["version"], changes,
                         thread_id=parent["thread_id"], redrive_after=redrive_after, ts=ts)
    if joined is None:
        raise RuntimeError(f"parent {parent['id']} changed under its lock")
    items = list(joined.outbox_ids)
    if not propagates(joined.row["status"]):  # running again: its own parent may resume too
        items += sync_parent(conn, joined.row, redrive_after=redrive_after, ts=ts)
    return items


# --- pauses --------------------------------------------------------------------------------


def surfaced_pending(child: Mapping[Any, Any]) -> dict[str, Any]:
    """A child's pause as its parent shows it: the same ask or approval, with ``run_id`` =
    the run that paused (the child, or the descendant the child itself surfaces)."""
    pending = dict(child["pending"] or {})
    pending["run_id"] = pending.get("run_id") or child["id"]
    return pending


def _first_waiting_child(conn: Connection, parent_id: str) -> RowMapping | None:
    """The parent's paused child whose call is still open, in call order."""
    q = (
        sa.select(runs)
        .join(tool_calls, sa.and_(tool_calls.c.run_id == runs.c.parent_run_id,
                                  tool_calls.c.call_id == runs.c.parent_call_id))
        .where(runs.c.parent_run_id == parent_id, runs.c.status == "waiting",
               tool_calls.c.status == CHILD)
        .order_by(tool_calls.c.round, tool_calls.c.idx)
        .limit(1)
    )
    return conn.execute(q).mappings().first()


_Delta = tuple[dict[str, Any], str, dict[str, Any]]  # (values, event type, event data)


def _pause_delta(conn: Connection, parent: RowMapping) -> _Delta | None:
    """How the parent's status follows its children's pauses; None = unchanged. A parent
    waits while one of its open children waits (showing the first, in call order), and runs
    again when none does. A pause of the parent's own is never touched."""
    if parent["status"] not in ("running", "waiting"):
        return None
    own = parent["pending"] or {}
    if parent["status"] == "waiting" and not own.get("run_id"):
        return None
    child = _first_waiting_child(conn, parent["id"])
    if child is not None:
        pending = surfaced_pending(child)
        if parent["status"] == "waiting" and own == pending:
            return None
        return ({"status": "waiting", "pending": pending, "wake_at": None}, "run.waiting",
                {"pending": pending})
    if parent["status"] == "waiting":
        resumed = {"child_run_id": own["run_id"]}
        return {"status": "running", "pending": None}, "run.resumed", resumed
    return None


def _add_delta(changes: repo.Changes, delta: _Delta) -> None:
    values, event, data = delta
    changes.values.update(values)
    changes.event(event, **data)


def sync_parent(
    conn: Connection, child: RowMapping, *, redrive_after: float, ts: float
) -> list[OutboxItem]:
    """After a child paused or resumed: bring its parent's status in line, and so on up the
    lineage while something changes (the ancestors must be locked: ``lock_lineage``)."""
    items: list[OutboxItem] = []
    while child["parent_run_id"] is not None:
        parent = _lock_row(conn, child["parent_run_id"])
        if parent is None:
            break
        delta = _pause_delta(conn, parent)
        if delta is None:
            break
        changes = repo.Changes(bump_version=False)
        _add_delta(changes, delta)
        applied = repo.apply(conn, parent["id"], parent["version"], changes,
                             redrive_after=redrive_after, ts=ts)
        if applied is None:
            raise RuntimeError(f"parent {parent['id']} changed under its lock")
        items += applied.outbox_ids
        child = applied.row
    return items


# --- queries -----------------------------------------------------------------------------


def active_children(conn: Connection, run_id: str) -> list[RowMapping]:
    """The run's children that are not final, oldest first."""
    q = (sa.select(runs).where(runs.c.parent_run_id == run_id, runs.c.status.not_in(FINAL))
         .order_by(runs.c.created_at, runs.c.id))
    return list(conn.execute(q).mappings())


def descendant_ids(conn: Connection, run_id: str) -> list[str]:
    """Every run below ``run_id`` (children, their children, …), breadth first."""
    out: list[str] = []
    level = [run_id]
    for _ in range(MAX_DEPTH + 1):
        level = list(conn.execute(
            sa.select(runs.c.id).where(runs.c.parent_run_id.in_(level))).scalars())
        if not level:
            break
        out += level
    return out
