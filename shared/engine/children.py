"""Sub-agents as child runs: a planning agent's hands can be other agents.

An inline tool ``{name, agent: <spec of kind agent>}`` is a ``SubAgentTool``. Its call is
dispatched like any external call (a tool task, windowed by ``parallel_tools``); the tool task,
instead of executing it, **starts a child run** (``shared.engine.subagent``). The parent's call
then holds no task, no lease and no thread: it waits in status ``child``, counted in the
parent's ``open_calls``.

Every change of a child that its parent must see passes through ``Tx.apply``
(``shared.engine.tx``), whose follow-ups include ``follow_up`` here, in the same transaction:

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

**Lock order**: see ``shared.engine.tx``. ``Tx.lock_lineage`` takes, for each ancestor root
first, the call that leads down and then its runs row. The parent's next pending call is
taken with ``SKIP LOCKED`` (``call_store.next_pending``), so a child's end never waits for a
sibling's commit that holds a row of the parent.

Cancel cascades: cancelling a run cancels its active children in the same transaction
(``shared.engine.commands``).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from typing import Any

from shared.agent.compression import reduce_tool_result
from shared.agent.spec import AgentSpec, InlineTool
from shared.engine.change import Change, Finished, tells_parent
from shared.engine.join import finish_call
from shared.engine.tx import Applied, Tx
from shared.store import ancestry
from shared.store import calls as call_store
from shared.store import runs as run_store
from shared.store.rows import FINAL, CallStatus, Run, Status
from shared.store.write import Inc
from shared.vocab import EventType

__all__ = [
    "charge_ancestors",
    "child_result_text",
    "child_run_id",
    "follow_up",
    "sub_agent_of",
    "surfaced_pending",
    "sync_parent",
]

log = logging.getLogger("treadle.children")


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


def charge_ancestors(tx: Tx, run: Run, cost: float) -> None:
    """Add ``cost``, which ``run`` incurred after its parent saw it end (a model call stopped
    by a cancel, billed once the work stopped), to every ancestor's cost: a parent's totals
    include its children's. Takes the lineage's locks (root first) before the caller touches
    ``run``'s own row."""
    if not cost or run.parent_run_id is None:
        return
    tx.lock_lineage(run, ending=False)
    for link in ancestry.ancestors(tx.conn, run.id):
        fresh = run_store.load_run(tx.conn, link.run_id)
        if fresh is not None:
            tx.apply(Change(fresh, bump=False, values={"cost": Inc(cost)}))


# --- after a child's status change ---------------------------------------------------------


def follow_up(tx: Tx, applied: Applied) -> Sequence[Change]:
    """A child ended, paused or resumed (its ancestors are locked): its parent follows — the
    child's end joins the parent's call, a pause surfaces on the parent."""
    if not tells_parent(applied.before, applied.change.status):
        return ()
    child = applied.after
    if child.status in FINAL:
        _finish_child(tx, child)
        return ()
    return _parent_change(tx, child)


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
    parent = run_store.lock_run(tx.conn, child.parent_run_id)
    if parent is None or parent.final:
        return
    call = call_store.get_call(tx.conn, parent.id, child.parent_call_id)
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
    spec = tx.rt.caches.spec_of(tx.conn, parent.id, loop=parent.loop)
    parent = finish_call(
        tx, parent, call, done, from_status=[CallStatus.CHILD], ask_timeout_s=spec.ask_timeout_s
    )
    if parent.open_calls > 0:  # no join: the parent may now show another child's pause
        change = _pause_change(tx, parent)
        if change is not None:
            tx.apply(change)


# --- pauses --------------------------------------------------------------------------------


def surfaced_pending(child: Run) -> dict[str, Any]:
    """A child's pause as its parent shows it: the same ask or approval, with ``run_id`` =
    the run that paused (the child, or the descendant the child itself surfaces)."""
    pending = dict(child.pending or {})
    pending["run_id"] = pending.get("run_id") or child.id
    return pending


def _pause_change(tx: Tx, parent: Run) -> Change | None:
    """How the parent's status follows its children's pauses; None = unchanged. A parent
    waits while one of its open children waits (showing the first, in call order), and runs
    again when none does. A pause of the parent's own is never touched."""
    if parent.status not in (Status.RUNNING, Status.WAITING):
        return None
    own = parent.pending or {}
    if parent.status == Status.WAITING and not own.get("run_id"):
        return None
    child = ancestry.first_waiting_child(tx.conn, parent.id)
    change = Change(parent, bump=False)
    if child is not None:
        pending = surfaced_pending(child)
        if parent.status == Status.WAITING and own == pending:
            return None
        change.values.update(status=Status.WAITING.value, pending=pending, wake_at=None)
        change.event(EventType.RUN_WAITING, pending=pending)
        return change
    if parent.status == Status.WAITING:
        change.values.update(status=Status.RUNNING.value, pending=None)
        change.event(EventType.RUN_RESUMED, child_run_id=own["run_id"])
        return change
    return None


def _parent_change(tx: Tx, child: Run) -> Sequence[Change]:
    if child.parent_run_id is None:
        return ()
    parent = run_store.lock_run(tx.conn, child.parent_run_id)
    if parent is None:
        return ()
    change = _pause_change(tx, parent)
    return (change,) if change is not None else ()


def sync_parent(tx: Tx, child: Run) -> None:
    """After a child paused or resumed: bring its parent's status in line (its ancestors are
    locked). ``Tx.apply`` of the parent's change tells the grandparent in turn."""
    for change in _parent_change(tx, child):
        tx.apply(change)
