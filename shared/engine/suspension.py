"""Suspend and resume (``POST /v1/runs/suspend``, ``/v1/runs/resume``): an operator parks a
live run at its next round boundary, holding nothing — no task, no worker thread, no lease:
``waiting`` with ``pending: {"kind": "suspended", ...}`` — and later lets it go on.

A run between rounds (its round due, unclaimed, no tools open) parks at once: the version
bump makes the round's dispatch stale. A run whose round or tools are in flight gets
``runs.suspend_at`` (no version bump: the round in flight commits as usual); the transition
that next queues its round parks it instead (``follow_up``, one of the transaction's
follow-ups), and the queued dispatch is taken back before it is published. Resume queues the
parked run's round (or, before it parked, takes the request back). Only top-level runs: a
sub-agent's run pauses with its root. The commands are ``shared.engine.fleet``'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from shared.engine.change import Change
from shared.engine.tx import Applied, Tx
from shared.store.rows import RUNNABLE, Run, Status
from shared.vocab import EventType

__all__ = ["KIND", "follow_up", "park", "suspended"]

KIND: Final = "suspended"


def suspended(run: Run) -> bool:
    return run.status == Status.WAITING and (run.pending or {}).get("kind") == KIND


def park(run: Run, ts: float) -> Change:
    pending = {"kind": KIND, "since": ts, "was": run.status.value, "round": run.round}
    change = Change(run)
    change.values.update(
        status=Status.WAITING.value,
        pending=pending,
        suspend_at=None,
        wake_at=None,
        lease_owner=None,
    )
    change.event(EventType.RUN_SUSPENDED, pending=pending)
    return change


def follow_up(tx: Tx, applied: Applied) -> Sequence[Change]:
    """A change queued the round of a run asked to suspend: park it instead (and take the
    round's dispatch back: it would be stale anyway)."""
    run = applied.after
    if not applied.change.queue_round or run.suspend_at is None or run.status not in RUNNABLE:
        return ()
    tx.out = [d for d in tx.out if not (d.kind == "round" and d.run_id == run.id)]
    return (park(run, tx.ts),)
