"""A run's hot row and what it was given (``runs``, ``run_specs``): reads, lists and the few
plain updates outside a transition. Every function works inside the caller's transaction and
returns typed rows (``shared.store.rows``). A run's state changes through the transition's
guarded write (``shared.store.write.Store.update_run``)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Connection

from shared.store.rows import Run, RunRecord, Status
from shared.store.tables import run_specs, runs, workers

__all__ = [
    "RunFilter",
    "due_query",
    "now",
    "search_runs",
    "record_of",
    "record_query",
    "live",
    "find_idempotent",
    "get_run",
    "list_runs",
    "load_run",
    "lock_run",
    "make_due",
    "matching_ids",
    "meta_match",
    "release_round",
    "run_meta",
    "run_spec",
    "run_trace",
    "set_agent",
    "set_base",
    "set_inputs",
    "spec_rev",
]


def now() -> float:
    return time.time()


def live(owner: Any, live_after: Any) -> Any:
    """SQL: the lease ``owner`` column names a worker whose heartbeat is fresh."""
    fresh = sa.select(workers.c.id).where(workers.c.seen_at >= live_after)
    return sa.and_(owner.is_not(None), owner.in_(fresh.scalar_subquery()))


# the hot reads, built once (bind parameters): a statement built per call costs more CPU
# than its round trip
_BY_ID = runs.c.id == sa.bindparam("b_run")

_OF_TENANT = runs.c.tenant == sa.bindparam("b_tenant")

_LOAD = sa.select(runs).where(_BY_ID)

_LOAD_OF_TENANT = _LOAD.where(_OF_TENANT)


def load_run(conn: Connection, run_id: str, tenant: str | None = None) -> Run | None:
    """A run's hot row (what the engine works with)."""
    q = _LOAD if tenant is None else _LOAD_OF_TENANT
    row = conn.execute(q, {"b_run": run_id, "b_tenant": tenant}).mappings().first()
    return Run.of(row) if row is not None else None


def lock_run(conn: Connection, run_id: str) -> Run | None:
    """The run's hot row, locked for the rest of the transaction."""
    row = conn.execute(sa.select(runs).where(runs.c.id == run_id).with_for_update()).mappings()
    first = row.first()
    return Run.of(first) if first is not None else None


_RECORD = sa.select(
    runs,
    run_specs.c.agent,
    run_specs.c.inputs,
    run_specs.c.meta,
    run_specs.c.warnings,
    run_specs.c.agent_ref,
).join(run_specs, run_specs.c.run_id == runs.c.id)


def record_of(row: Mapping[Any, Any]) -> RunRecord:
    """A row of ``record_query`` (or any select of it) as a ``RunRecord``."""
    return RunRecord(
        Run.of(row), row["agent"], row["inputs"], row["meta"], row["warnings"], row["agent_ref"]
    )


_GET = _RECORD.where(_BY_ID)

_GET_OF_TENANT = _GET.where(_OF_TENANT)


def record_query(of_tenant: bool) -> Any:
    """The statement that reads a run as the API shows it (``:b_run``, ``:b_tenant``)."""
    return _GET_OF_TENANT if of_tenant else _GET


def get_run(conn: Connection, run_id: str, tenant: str | None = None) -> RunRecord | None:
    """The run as the API shows it: its hot row and what it was given."""
    q = _GET if tenant is None else _GET_OF_TENANT
    row = conn.execute(q, {"b_run": run_id, "b_tenant": tenant}).mappings().first()
    return record_of(row) if row is not None else None


def find_idempotent(conn: Connection, tenant: str, key: str) -> RunRecord | None:
    q = _RECORD.where(runs.c.tenant == tenant, runs.c.idempotency_key == key)
    row = conn.execute(q).mappings().first()
    return record_of(row) if row is not None else None


def list_runs(
    conn: Connection,
    tenant: str,
    *,
    status: str | None = None,
    thread_id: str | None = None,
    limit: int = 50,
    before: tuple[float, str] | None = None,
) -> list[RunRecord]:
    found = RunFilter(statuses=(status,) if status else (), thread_id=thread_id)
    return search_runs(conn, tenant, found, limit=limit, before=before)


@dataclass(frozen=True)
class RunFilter:
    """What a search or a bulk action selects (every part must hold; empty: no constraint).
    ``metadata``: exact string values of the client's metadata keys; ``agent``: the named
    agent it ran (any version); ``suspended``: waiting with ``pending.kind`` suspended."""

    metadata: Mapping[str, str] = field(default_factory=dict)
    agent: str | None = None
    statuses: tuple[str, ...] = ()
    thread_id: str | None = None
    created_after: float | None = None
    created_before: float | None = None
    ended_after: float | None = None
    ended_before: float | None = None
    ids: tuple[str, ...] = ()
    top_level: bool = False
    suspended: bool = False


def meta_match(conn: Connection, column: Any, want: Mapping[str, str]) -> Any:
    """SQL: the JSON ``column`` holds each key with that string value (PostgreSQL: by
    containment, which migration 0084's GIN index serves for runs; SQLite: JSON paths)."""
    if conn.dialect.name == "postgresql":
        doc = sa.cast(sa.literal(json.dumps(dict(want))), JSONB)
        return sa.cast(column, JSONB).op("@>")(doc)
    return sa.and_(*(column[k].as_string() == v for k, v in want.items()))


def _agent_match(name: str) -> Any:
    escaped = name.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    ref = run_specs.c.agent_ref
    return sa.or_(ref == name, ref.like(f"{escaped}@%", escape="\\"))


def _where(conn: Connection, tenant: str, f: RunFilter) -> list[Any]:
    c = runs.c
    parts: list[Any] = [c.tenant == tenant]
    if f.metadata:
        parts.append(meta_match(conn, run_specs.c.meta, f.metadata))
    if f.agent:
        parts.append(_agent_match(f.agent))
    if f.statuses:
        parts.append(c.status.in_(f.statuses))
    if f.thread_id:
        parts.append(c.thread_id == f.thread_id)
    if f.ids:
        parts.append(c.id.in_(f.ids))
    if f.top_level:
        parts.append(c.parent_run_id.is_(None))
    if f.suspended:
        parts.append(c.pending["kind"].as_string() == "suspended")
    bounds = [
        (f.created_after, c.created_at, True),
        (f.created_before, c.created_at, False),
        (f.ended_after, c.ended_at, True),
        (f.ended_before, c.ended_at, False),
    ]
    for value, col, lower in bounds:
        if value is not None:
            parts.append(col >= value if lower else col < value)
    return parts


def search_runs(
    conn: Connection,
    tenant: str,
    f: RunFilter,
    *,
    limit: int = 50,
    before: tuple[float, str] | None = None,
) -> list[RunRecord]:
    """The tenant's runs that match ``f``, newest first; a page ends before ``before`` (the
    last row's ``(created_at, id)`` of the previous page: keyset paging, no offset)."""
    q = _RECORD.where(*_where(conn, tenant, f))
    if before:
        ts, rid = before
        q = q.where(
            sa.or_(runs.c.created_at < ts, sa.and_(runs.c.created_at == ts, runs.c.id < rid))
        )
    q = q.order_by(runs.c.created_at.desc(), runs.c.id.desc()).limit(limit)
    return [record_of(r) for r in conn.execute(q).mappings()]


def matching_ids(conn: Connection, tenant: str, f: RunFilter, limit: int) -> list[str]:
    """The ids of at most ``limit`` of the tenant's runs that match ``f``, oldest first."""
    q = (
        sa.select(runs.c.id)
        .join(run_specs, run_specs.c.run_id == runs.c.id)
        .where(*_where(conn, tenant, f))
        .order_by(runs.c.created_at, runs.c.id)
        .limit(limit)
    )
    return [str(r) for r in conn.execute(q).scalars()]


def run_spec(conn: Connection, run_id: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The run's agent spec and inputs (cache them under ``spec_rev``)."""
    agent, inputs = conn.execute(_SPEC, {"b_run": run_id}).one()
    return agent, inputs


_SPEC = sa.select(run_specs.c.agent, run_specs.c.inputs).where(
    run_specs.c.run_id == sa.bindparam("b_run")
)


def spec_rev(conn: Connection, run_id: str) -> int:
    """The revision of the run's spec (0 until a resume overrides it)."""
    rev = conn.execute(sa.select(runs.c.spec_rev).where(runs.c.id == run_id)).scalar()
    return int(rev or 0)


def run_trace(conn: Connection, run_id: str) -> dict[str, str] | None:
    """The trace context the run belongs to (W3C headers), when it was traced."""
    q = sa.select(run_specs.c.trace).where(run_specs.c.run_id == run_id)
    found = conn.execute(q).scalar()
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else None


def run_meta(conn: Connection, run_id: str) -> dict[str, Any] | None:
    """The client's metadata of a run (webhook bodies carry it)."""
    q = sa.select(run_specs.c.meta).where(run_specs.c.run_id == run_id)
    meta = conn.execute(q).scalar()
    return dict(meta) if isinstance(meta, dict) else None


def set_base(conn: Connection, run_id: str, base: Mapping[str, Any]) -> None:
    """A held run's base, set when it starts (it has no messages of its own yet): its own
    messages are numbered after the base's (``shared.store.lineage``)."""
    if not base:
        return
    values = {**base, "msg_seq": base["base_seq"]}
    conn.execute(sa.update(runs).where(runs.c.id == run_id).values(**values))


def set_agent(conn: Connection, run_id: str, agent: dict[str, Any]) -> None:
    """The run's agent spec, overridden (a resume); the caller bumps ``runs.spec_rev``."""
    conn.execute(sa.update(run_specs).where(run_specs.c.run_id == run_id).values(agent=agent))


def set_inputs(conn: Connection, run_id: str, inputs: dict[str, Any] | None) -> None:
    """A held run's inputs, completed when it is released (before its first round)."""
    conn.execute(sa.update(run_specs).where(run_specs.c.run_id == run_id).values(inputs=inputs))


def release_round(
    conn: Connection,
    run_id: str,
    version: int,
    owner: str,
    wake_at: float | None,
    *,
    counted: bool = True,
    sent: float | None = None,
) -> bool:
    """Give a claimed round back: due again at ``wake_at``. ``counted`` False: the attempt
    its claim counted is given back too (a transient model error, the fleet's capacity, the
    database or the broker out of reach: not the round's fault, and bounded elsewhere).
    ``sent``: when its next dispatch goes out (a countdown: the reaper's clock for it)."""
    values: dict[str, Any] = {"lease_owner": None, "wake_at": wake_at}
    if sent is not None:
        values["dispatched_at"] = sent
    if not counted:
        values["attempts"] = sa.case((runs.c.attempts > 0, runs.c.attempts - 1), else_=0)
    stmt = (
        sa.update(runs)
        .where(runs.c.id == run_id, runs.c.version == version, runs.c.lease_owner == owner)
        .values(**values)
    )
    return conn.execute(stmt).rowcount == 1


def make_due(conn: Connection, run_id: str, version: int) -> None:
    """A round waiting for its ``wake_at`` is due now (the test broker skips the wait)."""
    stmt = (
        sa.update(runs).where(runs.c.id == run_id, runs.c.version == version).values(wake_at=None)
    )
    conn.execute(stmt)


def due_query(status: Status, ts: float, limit: int, *columns: Any) -> sa.Select[Any]:
    """``columns`` of the runs in ``status`` whose ``wake_at`` has passed, earliest first."""
    return (
        sa.select(*columns)
        .where(runs.c.status == status.value, runs.c.wake_at.is_not(None), runs.c.wake_at <= ts)
        .order_by(runs.c.wake_at)
        .limit(limit)
    )
