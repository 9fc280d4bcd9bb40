"""Counts the operator's views read (``/metrics``, ``/healthz``): no run state changes here."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from shared.store.tables import runs, spend_envelopes

__all__ = ["ping", "runs_by_status", "runs_by_tenant", "spend_by_scope"]


def ping(conn: Connection) -> None:
    """One round trip: the database answers."""
    conn.execute(sa.text("SELECT 1"))


def runs_by_status(conn: Connection) -> dict[str, int]:
    rows = conn.execute(sa.select(runs.c.status, sa.func.count()).group_by(runs.c.status))
    return {str(status): int(n) for status, n in rows}


def runs_by_tenant(conn: Connection) -> dict[tuple[str, str], int]:
    rows = conn.execute(
        sa.select(runs.c.tenant, runs.c.status, sa.func.count()).group_by(
            runs.c.tenant, runs.c.status
        )
    )
    return {(str(tenant), str(status)): int(n) for tenant, status, n in rows}


def spend_by_scope(conn: Connection) -> dict[tuple[str, str], float]:
    """The envelopes' spent, reserved and caps, summed per scope (every tenant's)."""
    e = spend_envelopes.c
    rows = conn.execute(
        sa.select(
            e.scope, sa.func.sum(e.spent), sa.func.sum(e.reserved), sa.func.sum(e.cap)
        ).group_by(e.scope)
    )
    out: dict[tuple[str, str], float] = {}
    for scope, spent, reserved, cap in rows:
        out[(str(scope), "spent")] = float(spent or 0.0)
        out[(str(scope), "reserved")] = float(reserved or 0.0)
        out[(str(scope), "cap")] = float(cap or 0.0)
    return out
