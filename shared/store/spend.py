"""Spend envelopes (``spend_envelopes``): what a tenant may spend on models per day or month,
for the whole tenant, a named agent or a cron. A call reserves its worst case in every
envelope it counts against, each with one guarded UPDATE (``spent + reserved + amount <=
cap``), in key order, so two calls can never both take the last cent; it settles to its real
cost after. The run's own share of the same accounting is ``runs.reserved``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from shared.agent.spend import Period, period_window
from shared.store.rows import Run, Status
from shared.store.tables import runs, spend_envelopes, workers

__all__ = [
    "SCOPES",
    "Envelope",
    "Key",
    "delete_envelope",
    "envelope_tenants",
    "get_envelope",
    "list_envelopes",
    "put_envelope",
    "release_run",
    "reserve",
    "reserve_run",
    "roll",
    "settle",
    "wake_waiting",
    "leaked",
]

SCOPES = ("tenant", "agent", "cron")
Key = tuple[str, str]  # (scope, key); the tenant's own envelope is ("tenant", "")
_E = spend_envelopes.c


@dataclass(frozen=True, slots=True)
class Envelope:
    tenant: str
    scope: str
    key: str
    period: str
    cap: float
    on_exceed: str
    period_start: float
    period_end: float
    spent: float
    reserved: float
    created_at: float
    updated_at: float

    @classmethod
    def of(cls, row: Any) -> Envelope:
        return cls(**{f.name: row[f.name] for f in fields(cls)})

    @property
    def left(self) -> float:
        return self.cap - self.spent - self.reserved


def _of(tenant: str, scope: str, key: str) -> Any:
    return sa.and_(_E.tenant == tenant, _E.scope == scope, _E.key == key)


def list_envelopes(conn: Connection, tenant: str | None) -> list[Envelope]:
    """A tenant's envelopes (None: every tenant's), by scope and key."""
    q = sa.select(spend_envelopes).order_by(_E.tenant, _E.scope, _E.key)
    if tenant is not None:
        q = q.where(_E.tenant == tenant)
    return [Envelope.of(r) for r in conn.execute(q).mappings()]


def get_envelope(conn: Connection, tenant: str, scope: str, key: str) -> Envelope | None:
    row = conn.execute(sa.select(spend_envelopes).where(_of(tenant, scope, key))).mappings()
    found = row.first()
    return Envelope.of(found) if found is not None else None


def envelope_tenants(conn: Connection) -> set[str]:
    """The tenants that have at least one envelope."""
    return {str(t) for t in conn.execute(sa.select(_E.tenant).distinct()).scalars()}


def put_envelope(
    conn: Connection,
    tenant: str,
    scope: str,
    key: str,
    *,
    period: Period,
    cap: float,
    on_exceed: str,
    timezone: str,
    ts: float,
) -> Envelope:
    """Create or change an envelope; a changed period starts afresh (nothing spent yet in
    it), an unchanged one keeps what was spent and reserved."""
    window = period_window(ts, period, timezone)
    found = get_envelope(conn, tenant, scope, key)
    values = {"period": period, "cap": cap, "on_exceed": on_exceed, "updated_at": ts}
    if found is None:
        conn.execute(
            sa.insert(spend_envelopes).values(
                tenant=tenant,
                scope=scope,
                key=key,
                period_start=window.start,
                period_end=window.end,
                created_at=ts,
                **values,
            )
        )
    else:
        if found.period != period:
            values.update(period_start=window.start, period_end=window.end, spent=0.0)
        conn.execute(sa.update(spend_envelopes).where(_of(tenant, scope, key)).values(**values))
    envelope = get_envelope(conn, tenant, scope, key)
    assert envelope is not None
    return envelope


def delete_envelope(conn: Connection, tenant: str, scope: str, key: str) -> bool:
    return bool(conn.execute(sa.delete(spend_envelopes).where(_of(tenant, scope, key))).rowcount)


def roll(conn: Connection, tenant: str, ts: float, timezone: str) -> int:
    """Envelopes of ``tenant`` whose period ended start their current one: nothing spent yet
    (what calls in flight reserved stays reserved)."""
    ended = conn.execute(
        sa.select(_E.scope, _E.key, _E.period).where(_E.tenant == tenant, _E.period_end <= ts)
    ).all()
    for scope, key, period in ended:
        window = period_window(ts, period, timezone)
        conn.execute(
            sa.update(spend_envelopes)
            .where(_of(tenant, scope, key), _E.period_end <= ts)
            .values(period_start=window.start, period_end=window.end, spent=0.0, updated_at=ts)
        )
    return len(ended)


def reserve(conn: Connection, tenant: str, keys: Sequence[Key], amount: float) -> Envelope | None:
    """Reserve ``amount`` in each of the tenant's envelopes among ``keys``, in key order (the
    lock order); the first envelope that cannot take it is returned (the caller rolls back
    what the others took), None when all did."""
    for scope, key in sorted(set(keys)):
        took = conn.execute(
            sa.update(spend_envelopes)
            .where(_of(tenant, scope, key), _E.spent + _E.reserved + amount <= _E.cap)
            .values(reserved=_E.reserved + amount)
        ).rowcount
        if took:
            continue
        refused = get_envelope(conn, tenant, scope, key)
        if refused is not None:  # it exists, and it is full
            return refused
    return None


def settle(
    conn: Connection, tenant: str, keys: Sequence[Key], reserved: float, spent: float, ts: float
) -> None:
    """A call ended: what it reserved is released, what it cost is spent."""
    for scope, key in sorted(set(keys)):
        conn.execute(
            sa.update(spend_envelopes)
            .where(_of(tenant, scope, key))
            .values(
                reserved=sa.case((_E.reserved > reserved, _E.reserved - reserved), else_=0.0),
                spent=_E.spent + spent,
                updated_at=ts,
            )
        )


def reserve_run(conn: Connection, run_id: str, amount: float, cap: float | None) -> bool:
    """Reserve ``amount`` on the run itself: refused when its cost, what it already reserved
    and this would pass ``cap`` (its ``max_cost``; None: no cap)."""
    r = runs.c
    where = [r.id == run_id]
    if cap is not None:
        where.append(r.cost + r.reserved + amount <= cap)
    stmt = sa.update(runs).where(*where).values(reserved=r.reserved + amount)
    return bool(conn.execute(stmt).rowcount)


def release_run(conn: Connection, run_id: str, amount: float) -> None:
    """Give back what a call reserved on its run (its cost is added by its commit)."""
    r = runs.c
    stmt = (
        sa.update(runs)
        .where(r.id == run_id)
        .values(reserved=sa.case((r.reserved > amount, r.reserved - amount), else_=0.0))
    )
    conn.execute(stmt)


def wake_waiting(conn: Connection, tenant: str, ts: float) -> int:
    """The tenant's runs waiting for an envelope are due now (a cap was raised or an
    envelope removed): the reaper's next pass gives them their rounds."""
    r = runs.c
    stmt = (
        sa.update(runs)
        .where(
            r.tenant == tenant,
            r.status == Status.WAITING.value,
            r.pending["kind"].as_string() == "budget",
        )
        .values(wake_at=ts)
    )
    return int(conn.execute(stmt).rowcount)


def leaked(conn: Connection, before: float, live_after: float, limit: int = 100) -> list[Run]:
    """Runs holding a reservation that no live worker settles: their worker died and nobody
    took the round over (the run ended meanwhile, say). Last changed before ``before``."""
    r = runs.c
    fresh = sa.select(workers.c.id).where(workers.c.seen_at >= live_after).scalar_subquery()
    q = (
        sa.select(runs)
        .where(
            r.reserved > 0,
            r.updated_at < before,
            sa.or_(r.lease_owner.is_(None), r.lease_owner.not_in(fresh)),
        )
        .limit(limit)
    )
    return [Run.of(row) for row in conn.execute(q).mappings()]
