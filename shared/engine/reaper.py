"""The reaper re-drives from the database; it never executes work itself.

Each pass: (1) re-sends the dispatches nobody took, found from the state (a runnable run that
nobody holds, a queued tool call — each with when its dispatch went out —, work whose
worker's heartbeat stopped — at once): a dispatch unclaimed for the re-drive interval is lost
when its queue holds nothing, or when a worker already took one sent after it from the same
queue and priority (``_lost``: the workers' heartbeats say what they took); one still waiting
in its queue is not re-sent, so a backlog is not amplified, and a lost one is re-sent within
the re-drive interval and a pass whatever the queue holds behind it; the reaper's own task
has its own queue (``treadle.reaper``), so it never waits behind a backlog; (2)
re-sends webhook deliveries due; (3) expires asks, and tries runs waiting out a provider
outage again (``shared.engine.outage``); (4) releases held runs of threads left without an
active run (belt and braces: the transaction that ends a run releases its thread's next
one); (5) forgets long-dead workers.
First of all it releases scheduled runs that are due and fires crons
(``shared.engine.schedule``); last, it deletes ended runs past retention
(``shared.engine.retention``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TypeVar

from shared.engine import admission, metrics, outage, retention, schedule, spend, threads
from shared.engine.commands import expire_ask
from shared.engine.runtime import Dispatch, Runtime
from shared.engine.transition import transaction
from shared.names import ROUND_TASK, TASK_QUEUES, TOOL_TASK
from shared.store import admission as admission_store
from shared.store import outbox, redrive
from shared.store import runs as run_store
from shared.store import spend as spend_store
from shared.store import threads as thread_store
from shared.store import workers as worker_store
from shared.store.db import reading

__all__ = ["ReapReport", "reap"]

log = logging.getLogger("treadle.reaper")
WORKER_MEMORY_S = 3600.0  # a worker not seen for this long is forgotten


@dataclass(frozen=True)
class ReapReport:
    resent: int = 0  # every dispatch re-sent (rounds, tools, webhooks)
    expired_asks: int = 0
    webhooks: int = 0
    released: int = 0
    scheduled: int = 0  # scheduled runs released and cron slots fired


def reap(rt: Runtime) -> ReapReport:
    scheduled = schedule.tick(rt)  # scheduled runs and crons (shared.engine.schedule)
    resent = _redrive(rt)
    webhooks = _webhooks(rt)
    expired = _expire(rt)
    _settle_leaks(rt)
    released = _release_stalled(rt)
    released += _admit_waiting(rt)  # runs waiting for their tenant's admission
    _forget_workers(rt)
    retention.reap_pass(rt)  # ended runs past retention or ttl_s (shared.engine.retention)
    if resent or expired or webhooks or released:
        log.info(
            "reaper: resent=%d webhooks=%d expired_asks=%d released=%d",
            resent,
            webhooks,
            expired,
            released,
        )
    return ReapReport(resent + webhooks, expired, webhooks, released, scheduled)


def _redrive(rt: Runtime) -> int:
    hb = rt.heartbeat
    depth = rt.queue_depth() if rt.queue_depth is not None else None
    with rt.engine.begin() as conn:
        ts = _now()
        live_after = hb.live_after(ts)
        wait = rt.settings.redrive_seconds
        due_rounds = redrive.due_rounds(conn, ts, wait, live_after)
        due_calls = redrive.due_calls(conn, ts, wait, live_after)
        taken = worker_store.received_marks(conn) if due_rounds or due_calls else {}
        rounds = redrive.mark_rounds(conn, _lost(due_rounds, depth, taken, ROUND_TASK), ts)
        calls = redrive.mark_calls(conn, _lost(due_calls, depth, taken, TOOL_TASK), ts)
    out = [Dispatch.round(d.run_id, d.version) for d in rounds]
    out += [Dispatch.tool(d.run_id, d.call_id, d.version) for d in calls]
    if out:
        metrics.REAPER.labels(what="round").inc(len(rounds))
        metrics.REAPER.labels(what="tool").inc(len(calls))
        rt.publish(out)
        log.info(
            "reaper: re-sent %d rounds, %d tool calls (%d of a dead worker)",
            len(rounds),
            len(calls),
            sum(d.dead for d in rounds) + sum(d.dead for d in calls),
        )
    return len(out)


D = TypeVar("D", redrive.DueRound, redrive.DueCall)


def _lost(
    due: list[D], depth: dict[str, int] | None, taken: dict[str, float], task: str
) -> list[D]:
    """The dispatches lost for sure: all of a dead worker's; the others when their queue
    holds nothing, or when a worker already took a dispatch sent after them from the same
    queue at the same priority (a queue is FIFO per priority: what it took later, it would
    have given first). One still waiting in its queue is never re-sent (a backlog is not
    amplified), and one that is lost is re-sent on time however deep its queue is."""
    queue = TASK_QUEUES[task]
    if not (depth or {}).get(queue, 0):
        return due
    kept = [d for d in due if d.dead or d.sent < taken.get(f"{queue}/{d.priority}", 0.0)]
    if len(kept) < len(due):
        log.debug("reaper: %d %s dispatches still queued", len(due) - len(kept), task)
    return kept


def _settle_leaks(rt: Runtime) -> None:
    """Reservations a dead worker left on runs nobody took over (``shared.engine.spend``):
    spent in full, the most their calls could have cost."""
    ts = _now()
    with rt.engine.begin() as conn:
        for run in spend_store.leaked(
            conn, ts - rt.settings.lease_seconds, rt.heartbeat.live_after(ts)
        ):
            spend.settle_left(conn, run)


def _release_stalled(rt: Runtime, limit: int = 200) -> int:
    """Safety net: release held runs whose thread has no active run (every path that ends a
    run should already have done it, in the same transaction)."""
    with reading(rt.engine) as conn:
        stalled = thread_store.stalled_threads(conn, limit)
    released = 0
    for thread_id in stalled:
        with transaction(rt) as tx:
            tx.lock_thread(thread_id)
            nxt = threads.release_next(tx, thread_id)
            if nxt is not None:
                tx.apply(nxt)
                released += 1
    if released:
        log.warning("released %d held runs the ending transaction missed", released)
    return released


def _admit_waiting(rt: Runtime) -> int:
    """Every tenant with runs waiting for admission, in turn (after a limit was raised, or
    as a safety net)."""
    if rt.settings.tenant_active_runs <= 0:
        return 0
    with reading(rt.engine) as conn:
        tenants = admission_store.gated_tenants(conn)
    released = 0
    for tenant in tenants:
        with transaction(rt) as tx:
            for change in admission.release(tx, tenant):
                tx.apply(change)
                released += 1
    return released


def _webhooks(rt: Runtime) -> int:
    with rt.engine.begin() as conn:
        ts = _now()
        rows = outbox.due(conn, ts)
        outbox.postpone(conn, [r["id"] for r in rows], ts + rt.settings.redrive_seconds)
    out = [
        Dispatch(
            "webhook",
            r["run_id"],
            int(r["payload"].get("version", 0)),
            delivery_id=r["payload"]["delivery_id"],
            outbox_id=r["id"],
        )
        for r in rows
    ]
    if out:
        metrics.REAPER.labels(what="webhook").inc(len(out))
        rt.publish(out)
    return len(out)


def _expire(rt: Runtime) -> int:
    """Waiting runs whose time came: expire their ask, or try their provider again."""
    with reading(rt.engine) as conn:
        due = redrive.due_waits(conn, _now())
    asks = 0
    for d in due:
        if d.kind == outage.KIND:
            outage.redrive(rt, d.run_id)
        elif d.kind == spend.BUDGET:  # its envelope's period turned
            spend.wake(rt, d.run_id)
        else:
            expire_ask(rt, d.run_id)
            asks += 1
    return asks


def _forget_workers(rt: Runtime) -> None:
    with rt.engine.begin() as conn:
        worker_store.prune(conn, _now() - WORKER_MEMORY_S)


def _now() -> float:
    return run_store.now()
