"""The SQL of per-tenant admission (``shared.engine.admission``): a tenant's runs in flight, and
its runs waiting to be admitted — ``queued`` and ``held`` without a thread (a held run on a
thread waits for its thread instead, ``shared.store.threads``)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from shared.store.rows import Run, Status
from shared.store.tables import runs
from shared.vocab import IN_FLIGHT

__all__ = ["gated_tenants", "has_gated", "in_flight", "lock_gated", "open_runs"]

_IN_FLIGHT = (Status.QUEUED.value, Status.RUNNING.value)


def open_runs(conn: Connection, tenant: str) -> int:
    """The tenant's runs in flight as its limit on open runs counts them: scheduled, queued,
    running and waiting, but a run held behind its thread's active run (one held for
    admission counts)."""
    q = (
        sa.select(sa.func.count())
        .select_from(runs)
        .where(
            runs.c.tenant == tenant,
            runs.c.status.in_([s.value for s in IN_FLIGHT]),
            sa.or_(runs.c.held.is_(False), runs.c.thread_id.is_(None)),
        )
    )
    return int(conn.execute(q).scalar_one())


def _gated() -> sa.ColumnElement[bool]:
    r = runs.c
    return sa.and_(r.status == Status.QUEUED.value, r.held == sa.true(), r.thread_id.is_(None))


def in_flight(conn: Connection, tenant: str) -> int:
    """The tenant's admitted runs that hold or await a round (waiting runs hold none)."""
    q = (
        sa.select(sa.func.count())
        .select_from(runs)
        .where(runs.c.tenant == tenant, runs.c.status.in_(_IN_FLIGHT), runs.c.held == sa.false())
    )
    return int(conn.execute(q).scalar_one())


def has_gated(conn: Connection, tenant: str) -> bool:
    q = sa.select(runs.c.id).where(runs.c.tenant == tenant, _gated()).limit(1)
    return conn.execute(q).first() is not None


def lock_gated(conn: Connection, tenant: str, limit: int) -> list[Run]:
    """The tenant's next runs to admit, highest priority then oldest first, locked; a run
    another transaction is admitting is skipped (``SKIP LOCKED``), never waited for."""
    q = (
        sa.select(runs)
        .where(runs.c.tenant == tenant, _gated())
        .order_by(runs.c.priority.desc(), runs.c.created_at, runs.c.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    return [Run.of(r) for r in conn.execute(q).mappings()]


def gated_tenants(conn: Connection, limit: int = 1000) -> list[str]:
    q = sa.select(runs.c.tenant).where(_gated()).distinct().limit(limit)
    return [str(t) for t in conn.execute(q).scalars()]
