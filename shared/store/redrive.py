"""What the reaper finds due, from the state alone (there is no outbox row for rounds and
tool calls): a runnable run that nobody holds and nothing is dispatched for, a dispatched call
nobody took, work whose worker died, an ask that expired, a run waiting out a provider outage
whose next try is due."""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from shared.store.rows import RUNNABLE, CallStatus, Status
from shared.store.runs import due_query
from shared.store.tables import runs, tool_calls, workers

__all__ = [
    "BACKOFF_CAP",
    "BACKOFF_FREE",
    "DueCall",
    "DueRound",
    "DueWait",
    "due_calls",
    "due_rounds",
    "due_waits",
    "expired_asks",
    "mark_calls",
    "mark_rounds",
]

BACKOFF_FREE = 5
"""Re-sends of one dispatch that may follow one another at the re-drive interval; past them
(a dispatch that keeps going unclaimed, a bug, not a loss) they back off 2, 4 … 64 times it."""
BACKOFF_CAP = 6


@dataclass(frozen=True, slots=True)
class DueRound:
    run_id: str
    version: int
    dead: bool = False  # its worker died holding it (else: nobody took its dispatch)
    priority: int = 5
    sent: float = 0.0  # when its dispatch went out


@dataclass(frozen=True, slots=True)
class DueCall:
    run_id: str
    call_id: str
    version: int
    dead: bool = False
    priority: int = 5
    sent: float = 0.0


def _dead(owner: sa.ColumnElement[str], live_after: float) -> sa.ColumnElement[bool]:
    fresh = sa.select(workers.c.id).where(workers.c.seen_at >= live_after).scalar_subquery()
    return sa.and_(owner.is_not(None), owner.not_in(fresh))


def _waited(
    since: sa.ColumnElement[float], redrives: sa.ColumnElement[int], ts: float, redrive: float
) -> sa.ColumnElement[bool]:
    """``since`` is older than the re-drive interval (times 2, 4 … 64 once a dispatch was
    re-sent ``BACKOFF_FREE`` times in a row without being claimed)."""
    steps = range(BACKOFF_FREE, BACKOFF_FREE + BACKOFF_CAP)
    factor = sa.case(
        (redrives <= BACKOFF_FREE, 1),
        *((redrives == n + 1, 2 ** (n + 1 - BACKOFF_FREE)) for n in steps),
        else_=2**BACKOFF_CAP,
    )
    return since < ts - redrive * factor


def due_rounds(
    conn: Connection, ts: float, redrive: float, live_after: float, limit: int = 500
) -> list[DueRound]:
    """Runs due for a round that nobody holds: its dispatch went out (and, a countdown, came
    due) more than the re-drive interval ago, or a worker that died holds it (at once).
    Whether the dispatch is still in its queue is the reaper's to judge (``sent``)."""
    r = runs.c
    dead = _dead(r.lease_owner, live_after)
    since = sa.func.coalesce(r.dispatched_at, r.updated_at)
    idle = sa.and_(
        r.lease_owner.is_(None),
        _waited(since, r.redrives, ts, redrive),
        sa.or_(r.wake_at.is_(None), r.wake_at < ts - redrive),
    )
    q = (
        sa.select(r.id, r.version, dead, r.priority, since)
        .where(
            r.status.in_([s.value for s in RUNNABLE]),
            r.open_calls == 0,
            r.held == sa.false(),
            sa.or_(r.wake_at.is_(None), r.wake_at <= ts),
            sa.or_(dead, idle),
        )
        .limit(limit)
    )
    return [
        DueRound(str(i), int(v), bool(d), int(p), float(t or 0.0))
        for i, v, d, p, t in conn.execute(q)
    ]


def due_calls(
    conn: Connection, ts: float, redrive: float, live_after: float, limit: int = 500
) -> list[DueCall]:
    """Dispatched calls nobody took in time, and claimed calls whose worker died."""
    c = tool_calls.c
    dead = sa.and_(c.status == CallStatus.RUNNING.value, _dead(c.lease_owner, live_after))
    q = (
        sa.select(c.run_id, c.call_id, runs.c.version, dead, runs.c.priority, c.queued_at)
        .join(runs, runs.c.id == c.run_id)
        .where(
            sa.or_(
                sa.and_(
                    c.status == CallStatus.QUEUED.value,
                    _waited(c.queued_at, c.redrives, ts, redrive),
                ),
                dead,
            ),
            runs.c.status.in_([s.value for s in RUNNABLE]),
        )
        .limit(limit)
    )
    return [
        DueCall(str(r), str(k), int(v), bool(d), int(p), float(t or 0.0))
        for r, k, v, d, p, t in conn.execute(q)
    ]


def mark_rounds(conn: Connection, due: list[DueRound], ts: float) -> list[DueRound]:
    """Count a re-send and stamp when it goes out (``updated_at`` stays the time the round
    became due, the start of its queue wait); returns those marked (a run another
    transaction holds right now is skipped: that one dispatches what comes next)."""
    if not due:
        return []
    r = runs.c
    locked = (
        sa.select(r.id)
        .where(r.id.in_([d.run_id for d in due]))
        .with_for_update(skip_locked=True)
        .scalar_subquery()
    )
    stmt = (
        sa.update(runs)
        .where(r.id.in_(locked))
        .values(redrives=r.redrives + 1, dispatched_at=ts)
        .returning(r.id, r.version)
    )
    marked = {(str(i), int(v)) for i, v in conn.execute(stmt)}
    return [d for d in due if (d.run_id, d.version) in marked]


def mark_calls(conn: Connection, due: list[DueCall], ts: float) -> list[DueCall]:
    """Count a re-send of each call; returns those marked (a call row another transaction
    holds is skipped, never waited for: a paused worker's lock must not park the reaper)."""
    out = []
    c = tool_calls.c
    for d in due:
        locked = (
            sa.select(c.call_id)
            .where(c.run_id == d.run_id, c.call_id == d.call_id)
            .with_for_update(skip_locked=True)
            .scalar_subquery()
        )
        stmt = (
            sa.update(tool_calls)
            .where(c.run_id == d.run_id, c.call_id == locked)
            .values(redrives=c.redrives + 1, queued_at=ts)
        )
        if conn.execute(stmt).rowcount == 1:
            out.append(d)
    return out


@dataclass(frozen=True, slots=True)
class DueWait:
    run_id: str
    kind: str | None  # what the run waits on: ask (it expired), provider (try it again)


def due_waits(conn: Connection, ts: float, limit: int = 200) -> list[DueWait]:
    """Waiting runs whose ``wake_at`` has passed, oldest first."""
    q = due_query(Status.WAITING, ts, limit, runs.c.id, runs.c.pending)
    return [DueWait(str(i), (p or {}).get("kind")) for i, p in conn.execute(q)]


def expired_asks(conn: Connection, ts: float, limit: int = 200) -> list[str]:
    return [d.run_id for d in due_waits(conn, ts, limit) if d.kind == "ask"]
