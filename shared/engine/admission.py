"""Per-tenant fairness: a tenant has at most ``TREADLE_TENANT_ACTIVE_RUNS`` top-level runs in
flight (queued or running, admitted); a new run beyond that is created ``queued`` and ``held``
(no broker message) and admitted later, highest priority then oldest first:

* by the transaction that ends or pauses one of the tenant's runs (it admits the next one in
  the same transaction, so a freed slot is never idle), and
* by the reaper's pass, tenant by tenant (a safety net, and after the limit is raised).

So each tenant has at most that many rounds in the broker's queues at any time, and another
tenant's new run waits behind at most (tenants × limit) / fleet concurrency rounds, never
behind one tenant's whole backlog. Sub-agent runs and runs on a thread (one at a time per
thread already) are never held here. ``0`` turns admission off. The count is a soft limit:
two transactions admitting at once may each admit one.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from shared.engine.change import Change, frees_slot
from shared.engine.tx import Applied, Tx
from shared.store import admission as store
from shared.vocab import EventType

__all__ = ["follow_up", "gate", "release"]

log = logging.getLogger("treadle.admission")


def gate(tx: Tx, tenant: str) -> bool:
    """Must a new top-level run of ``tenant`` wait for admission? (the limit is reached, or
    older runs already wait: they go first)."""
    cap = tx.rt.settings.tenant_active_runs
    if cap <= 0:
        return False
    return store.in_flight(tx.conn, tenant) >= cap or store.has_gated(tx.conn, tenant)


def follow_up(tx: Tx, applied: Applied) -> Sequence[Change]:
    """A top-level run in flight ended or paused: its tenant's next waiting runs start."""
    if not frees_slot(applied.before, applied.change.status):
        return ()
    return release(tx, applied.before.tenant)


def release(tx: Tx, tenant: str) -> list[Change]:
    """The changes that admit the tenant's waiting runs while it is under its limit."""
    cap = tx.rt.settings.tenant_active_runs
    if cap <= 0 or not store.has_gated(tx.conn, tenant):
        return []
    free = cap - store.in_flight(tx.conn, tenant)
    if free <= 0:
        return []
    changes = []
    for run in store.lock_gated(tx.conn, tenant, free):
        change = Change(run, queue_round=True, guard={"held": True})
        change.values["held"] = False
        change.event(EventType.RUN_RELEASED, admitted=True)
        changes.append(change)
    return changes
