"""Actions on many runs at once (``POST /v1/runs/cancel``, ``/suspend``, ``/resume``), and
the single-run suspend and resume they are made of (``shared.engine.suspension`` parks).

A bulk action names its runs by id or by a filter (``shared.store.runs.RunFilter``), at most
``MAX_BULK`` per call. Each run is its own transition (read again and retried while it loses
a race), so one run's refusal does not undo another's action; every run's outcome is
reported. A filter selects only the runs the action applies to (cancel: not ended; suspend:
top-level and running; resume: suspended), oldest first, so calling again goes on with the
rest (``more``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Final

from shared.engine import admission, commands
from shared.engine.change import Change
from shared.engine.runtime import Runtime
from shared.engine.suspension import KIND, park, suspended
from shared.engine.transition import retrying
from shared.engine.tx import Tx
from shared.errors import Conflict, NotFound
from shared.store import runs as run_store
from shared.store.db import reading
from shared.store.rows import RUNNABLE, Run, Status
from shared.store.runs import RunFilter
from shared.vocab import IN_FLIGHT, EventType

__all__ = [
    "ACTIONS",
    "MAX_BULK",
    "Outcome",
    "bulk",
    "resume_run",
    "select_runs",
    "suspend_run",
]

MAX_BULK: Final = 500
"""The most runs one bulk call acts on."""

_ELIGIBLE: Final[dict[str, frozenset[Status]]] = {
    "cancel": frozenset(IN_FLIGHT),
    "suspend": frozenset(RUNNABLE),
    "resume": frozenset({Status.WAITING}),
}


@dataclass(frozen=True)
class Outcome:
    """What an action did to one run: ``cancelled``, ``suspended`` (parked now),
    ``suspending`` (parks at its next round boundary), ``resumed``; or ``not_found``,
    ``skipped`` (its state refused the action: ``detail`` says why)."""

    run_id: str
    outcome: str
    status: str | None = None
    detail: str | None = None


def _loaded(tx: Tx, tenant: str, run_id: str) -> Run:
    run = run_store.load_run(tx.conn, run_id, tenant)
    if run is None:
        raise NotFound(f"run {run_id} not found")
    return run


def suspend_run(rt: Runtime, tenant: str, run_id: str) -> Outcome:
    """Suspend one run. NotFound; Conflict when it is not a live top-level run."""

    def op(tx: Tx) -> Outcome:
        run = _loaded(tx, tenant, run_id)
        if suspended(run) or run.suspend_at is not None:
            raise Conflict(f"run {run_id} is already suspended")
        if run.parent_run_id is not None:
            raise Conflict(f"run {run_id} is a sub-agent's run: suspend its root")
        if run.status not in RUNNABLE or run.held:
            raise Conflict(f"run {run_id} is {run.status}, not running")
        if run.lease_owner is None and run.open_calls == 0:
            new = tx.apply(park(run, tx.ts))
            return Outcome(run_id, "suspended", new.status.value)
        tx.apply(Change(run, bump=False, values={"suspend_at": tx.ts}))
        return Outcome(run_id, "suspending", run.status.value)

    return retrying(rt, op)


def resume_run(rt: Runtime, tenant: str, run_id: str) -> Outcome:
    """Resume one suspended run: its round is queued. Conflict when it is not suspended."""

    def op(tx: Tx) -> Outcome:
        run = _loaded(tx, tenant, run_id)
        if run.suspend_at is not None and not suspended(run):  # not parked yet
            tx.apply(Change(run, bump=False, values={"suspend_at": None}))
            return Outcome(run_id, "resumed", run.status.value)
        if not suspended(run):
            raise Conflict(f"run {run_id} is not suspended")
        new = tx.apply(_resumed(tx, run))
        return Outcome(run_id, "resumed", new.status.value)

    return retrying(rt, op)


def _resumed(tx: Tx, run: Run) -> Change:
    """A suspended run goes on: its round is queued — or, when its tenant is at its limit of
    runs in flight (``shared.engine.admission``), it waits ``queued`` and held to be admitted
    like a new run (a run on a thread never waits here)."""
    was = str((run.pending or {}).get("was") or Status.RUNNING.value)
    status = Status(was) if Status(was) in RUNNABLE else Status.RUNNING
    if run.thread_id is None and admission.gate(tx, run.tenant):
        change = Change(run)
        change.values.update(status=Status.QUEUED.value, held=True, pending=None, wake_at=None)
        change.event(EventType.RUN_RESUMED, after=KIND, admitted=False)
        return change
    change = Change(run, queue_round=True)
    change.values.update(status=status.value, pending=None, wake_at=None)
    change.event(EventType.RUN_RESUMED, after=KIND)
    return change


def cancel_run(rt: Runtime, tenant: str, run_id: str) -> Outcome:
    record = commands.cancel_run(rt, tenant, run_id)
    return Outcome(run_id, "cancelled", record.run.status.value)


ACTIONS: Final[dict[str, Callable[[Runtime, str, str], Outcome]]] = {
    "cancel": cancel_run,
    "suspend": suspend_run,
    "resume": resume_run,
}


def select_runs(
    rt: Runtime, tenant: str, action: str, f: RunFilter, limit: int
) -> tuple[list[str], bool]:
    """The ids of at most ``limit`` runs ``f`` matches that ``action`` applies to (oldest
    first), and whether more match."""
    eligible = _ELIGIBLE[action]
    statuses = tuple(s for s in (f.statuses or eligible) if s in eligible)
    if not statuses:
        return [], False
    f = replace(
        f,
        statuses=statuses,
        top_level=f.top_level or action == "suspend",
        suspended=action == "resume",
    )
    with reading(rt.engine) as conn:
        ids = run_store.matching_ids(conn, tenant, f, min(limit, MAX_BULK) + 1)
    return ids[:limit], len(ids) > limit


def bulk(rt: Runtime, tenant: str, action: str, ids: Sequence[str]) -> list[Outcome]:
    """``action`` on each run (at most ``MAX_BULK``; an id named twice is acted on once)."""
    act = ACTIONS[action]
    out = []
    for run_id in list(dict.fromkeys(ids))[:MAX_BULK]:
        try:
            out.append(act(rt, tenant, run_id))
        except NotFound:
            out.append(Outcome(run_id, "not_found"))
        except Conflict as exc:
            out.append(Outcome(run_id, "skipped", detail=str(exc)))
    return out
