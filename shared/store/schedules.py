"""The SQL of schedules: runs scheduled for later (``status = 'scheduled'``, due at
``wake_at``) and crons (``crons``; each fired slot one ``cron_fires`` row, whose primary key
(cron_id, slot) is what makes a slot fire once fleet-wide). The policy is
``shared.engine.schedule``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from shared.store.rows import Status
from shared.store.runs import due_query
from shared.store.tables import cron_fires, crons, runs

__all__ = [
    "Cron",
    "claim_slot",
    "count_crons",
    "delete_cron",
    "due_crons",
    "due_scheduled",
    "get_cron",
    "insert_cron",
    "list_crons",
    "set_next",
    "set_paused",
]


@dataclass(frozen=True, slots=True)
class Cron:
    id: str
    tenant: str
    agent: dict[str, Any]  # {"spec": {...}, "ref": "name@3" | None}
    input: Any
    schedule: str
    timezone: str
    thread_id: str | None
    meta: dict[str, Any] | None
    options: dict[str, Any] | None
    paused: bool
    next_fire: float | None
    last_slot: float | None
    last_run_id: str | None
    created_at: float
    updated_at: float

    @classmethod
    def of(cls, row: Mapping[Any, Any]) -> Cron:
        return cls(**{name: row[name] for name in cls.__slots__})


# --- scheduled runs -------------------------------------------------------------------------


def due_scheduled(conn: Connection, ts: float, limit: int = 200) -> list[str]:
    """Scheduled runs whose time came, earliest first."""
    q = due_query(Status.SCHEDULED, ts, limit, runs.c.id)
    return [str(i) for i in conn.execute(q).scalars()]


# --- crons ----------------------------------------------------------------------------------


def insert_cron(conn: Connection, row: Mapping[str, Any], ts: float) -> Cron:
    stmt = sa.insert(crons).values(**row, created_at=ts, updated_at=ts).returning(*crons.c)
    return Cron.of(conn.execute(stmt).mappings().one())


def get_cron(conn: Connection, cron_id: str, tenant: str | None = None) -> Cron | None:
    q = sa.select(crons).where(crons.c.id == cron_id)
    if tenant is not None:
        q = q.where(crons.c.tenant == tenant)
    row = conn.execute(q).mappings().first()
    return Cron.of(row) if row is not None else None


def list_crons(
    conn: Connection,
    tenant: str,
    *,
    thread_id: str | None = None,
    agent_ref: str | None = None,
    limit: int = 100,
    offset: int = 0,
) -> list[Cron]:
    q = sa.select(crons).where(crons.c.tenant == tenant)
    if thread_id is not None:
        q = q.where(crons.c.thread_id == thread_id)
    q = q.order_by(crons.c.created_at.desc(), crons.c.id.desc())
    rows = [Cron.of(r) for r in conn.execute(q).mappings()]
    if agent_ref is not None:  # the agent column is JSON: filtered here, not in SQL
        rows = [c for c in rows if (c.agent.get("ref") or "").split("@")[0] == agent_ref]
    return rows[offset : offset + limit]


def delete_cron(conn: Connection, cron_id: str, tenant: str) -> bool:
    """Delete a cron and its fire log; False when the tenant has no such cron."""
    gone = conn.execute(sa.delete(crons).where(crons.c.id == cron_id, crons.c.tenant == tenant))
    if gone.rowcount != 1:
        return False
    conn.execute(sa.delete(cron_fires).where(cron_fires.c.cron_id == cron_id))
    return True


def set_paused(
    conn: Connection, cron_id: str, tenant: str, paused: bool, next_fire: float | None, ts: float
) -> Cron | None:
    stmt = (
        sa.update(crons)
        .where(crons.c.id == cron_id, crons.c.tenant == tenant)
        .values(paused=paused, next_fire=next_fire, updated_at=ts)
        .returning(*crons.c)
    )
    row = conn.execute(stmt).mappings().first()
    return Cron.of(row) if row is not None else None


def count_crons(conn: Connection, tenant: str) -> int:
    q = sa.select(sa.func.count()).select_from(crons).where(crons.c.tenant == tenant)
    return int(conn.execute(q).scalar_one())


def due_crons(conn: Connection, ts: float, limit: int = 100) -> list[Cron]:
    """Unpaused crons whose next slot has come, at most ``limit``, tenant by tenant in turn:
    every tenant's earliest first, then every tenant's second, ... (one tenant's thousand due
    crons do not push another tenant's one to a later pass)."""
    turn = (
        sa.func.row_number()
        .over(partition_by=crons.c.tenant, order_by=(crons.c.next_fire, crons.c.id))
        .label("turn")
    )
    due = (
        sa.select(crons, turn)
        .where(crons.c.paused == sa.false(), crons.c.next_fire <= ts)
        .subquery()
    )
    q = sa.select(*[due.c[c.name] for c in crons.c]).order_by(due.c.turn, due.c.next_fire, due.c.id)
    return [Cron.of(r) for r in conn.execute(q.limit(limit)).mappings()]


def claim_slot(conn: Connection, cron_id: str, slot: float, ts: float) -> bool:
    """``INSERT INTO cron_fires ... ON CONFLICT DO NOTHING``: True = this transaction fires the
    slot; False = another process did (a concurrent insert waits for the other transaction
    and then conflicts, so exactly one of them sees True)."""
    insert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
    stmt = (
        insert(cron_fires)
        .values(cron_id=cron_id, slot=slot, fired_at=ts)
        .on_conflict_do_nothing(index_elements=[cron_fires.c.cron_id, cron_fires.c.slot])
        .returning(cron_fires.c.cron_id)
    )
    return conn.execute(stmt).first() is not None


def set_next(
    conn: Connection,
    cron_id: str,
    next_fire: float | None,
    ts: float,
    *,
    slot: float | None = None,
    run_id: str | None = None,
) -> None:
    """The cron's next slot; with ``slot``: the slot it fired (and the run, logged too)."""
    values: dict[str, Any] = {"next_fire": next_fire, "updated_at": ts}
    if slot is not None:
        values.update(last_slot=slot, last_run_id=run_id)
        conn.execute(
            sa.update(cron_fires)
            .where(cron_fires.c.cron_id == cron_id, cron_fires.c.slot == slot)
            .values(run_id=run_id)
        )
    q = sa.update(crons).where(crons.c.id == cron_id)
    if slot is not None:  # never move a cron back (a slower process fired an older slot)
        q = q.where(sa.or_(crons.c.last_slot.is_(None), crons.c.last_slot <= slot))
    conn.execute(q.values(**values))
