"""The reaper re-drives from the database; it never executes work itself.

Each pass: (1) re-sends outbox messages nobody consumed in time, (2) expires asks, (3) gives
a round message to any running run that has none and no live lease (belt and braces: the
outbox should already cover it), (4) releases held runs of threads left without an active run
(belt and braces too: the transaction that ends a run releases its thread's next run).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import sqlalchemy as sa

from shared.engine import threads
from shared.engine.commands import expire_ask
from shared.engine.runtime import Runtime
from shared.store import repo
from shared.store.tables import outbox, runs

__all__ = ["ReapReport", "reap"]

log = logging.getLogger("treadle.reaper")


@dataclass(frozen=True)
class ReapReport:
    resent: int = 0
    expired_asks: int = 0
    orphans: int = 0
    released: int = 0


def reap(rt: Runtime) -> ReapReport:
    ts = repo.now()
    resent = _resend(rt, ts)
    expired = _expire(rt, ts)
    orphans = _orphans(rt, ts)
    released = threads.release_stalled(rt)
    if resent or expired or orphans or released:
        log.info(
            "reaper: resent=%d expired_asks=%d orphans=%d released=%d",
            resent,
            expired,
            orphans,
            released,
        )
    return ReapReport(resent, expired, orphans, released)


def _resend(rt: Runtime, ts: float) -> int:
    with rt.engine.begin() as conn:
        rows = repo.due_outbox(conn, ts)
        repo.postpone_outbox(conn, [r["id"] for r in rows], ts + rt.settings.redrive_seconds)
    rt.publish([(r["id"], r["kind"], r["payload"]) for r in rows])
    return len(rows)


def _expire(rt: Runtime, ts: float) -> int:
    with rt.engine.connect() as conn:
        ids = (
            conn.execute(
                sa.select(runs.c.id)
                .where(
                    runs.c.status == "waiting", runs.c.wake_at.is_not(None), runs.c.wake_at <= ts
                )
                .limit(200)
            )
            .scalars()
            .all()
        )
    for run_id in ids:
        expire_ask(rt, run_id)
    return len(ids)


def _orphans(rt: Runtime, ts: float) -> int:
    """Running runs, no open tools, no live lease, no outbox row, idle past the redrive time."""
    stale = ts - rt.settings.redrive_seconds
    has_msg = sa.exists().where(outbox.c.run_id == runs.c.id, outbox.c.kind.in_(("round", "tool")))
    with rt.engine.begin() as conn:
        rows = conn.execute(
            sa.select(runs.c.id, runs.c.version)
            .where(
                runs.c.status.in_(("queued", "running")),
                runs.c.open_calls == 0,
                sa.or_(runs.c.lease_until.is_(None), runs.c.lease_until < ts),
                runs.c.held == sa.false(),
                runs.c.updated_at < stale,
                ~has_msg,
            )
            .limit(200)
        ).all()
        items = []
        for run_id, version in rows:
            row = conn.execute(
                sa.insert(outbox)
                .values(
                    run_id=run_id,
                    kind="round",
                    payload={"run_id": run_id, "version": version},
                    available_at=ts + rt.settings.redrive_seconds,
                    created_at=ts,
                )
                .returning(outbox.c.id)
            ).scalar_one()
            items.append((row, "round", {"run_id": run_id, "version": version}))
    rt.publish(items)
    return len(items)
