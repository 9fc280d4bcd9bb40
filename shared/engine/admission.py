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

from shared.engine.runtime import Runtime
from shared.engine.transition import Change, Tx, transaction
from shared.store import admission as store

__all__ = ["gate", "release", "release_all"]

log = logging.getLogger("treadle.admission")


def gate(tx: Tx, tenant: str) -> bool:
    """Must a new top-level run of ``tenant`` wait for admission? (the limit is reached, or
    older runs already wait: they go first)."""
    cap = tx.rt.settings.tenant_active_runs
    if cap <= 0:
        return False
    return store.in_flight(tx.conn, tenant) >= cap or store.has_gated(tx.conn, tenant)


def release(tx: Tx, tenant: str) -> int:
    """Admit the tenant's waiting runs while it is under its limit; returns how many."""
    cap = tx.rt.settings.tenant_active_runs
    if cap <= 0 or not store.has_gated(tx.conn, tenant):
        return 0
    free = cap - store.in_flight(tx.conn, tenant)
    if free <= 0:
        return 0
    admitted = store.lock_gated(tx.conn, tenant, free)
    for run in admitted:
        change = Change(run, queue_round=True, guard={"held": True})
        change.values["held"] = False
        change.event("run.released", admitted=True)
        tx.apply(change)
    return len(admitted)


def release_all(rt: Runtime) -> int:
    """The reaper's pass: every tenant with waiting runs, in turn."""
    if rt.settings.tenant_active_runs <= 0:
        return 0
    with rt.engine.connect() as conn:
        tenants = store.gated_tenants(conn)
    released = 0
    for tenant in tenants:
        with transaction(rt) as tx:
            released += release(tx, tenant)
    return released
