"""A run's tool calls (``tool_calls``): the rows a round's reply makes, their claims by tool
tasks (an attempt counted, a lease owned, a fence checked before an effect), the values set
on them (``set_calls``) and the next pending call of a windowed batch. A row another
transaction holds is skipped (``SKIP LOCKED``), never waited for."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import lru_cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from shared.store.rows import Call, CallStatus, Run
from shared.store.runs import live
from shared.store.tables import runs, tool_calls

__all__ = [
    "calls_params",
    "calls_update",
    "values_shape",
    "call_and_run",
    "call_ids_among",
    "claim_call",
    "claim_params",
    "claim_values",
    "claimable",
    "claimed",
    "get_call",
    "holds_call",
    "insert_calls",
    "list_tool_calls",
    "next_pending",
    "queue_calls",
    "round_of_call",
    "set_calls",
]


_INSERT_CALLS = sa.insert(tool_calls)


def insert_calls(conn: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
    if rows:
        conn.execute(_INSERT_CALLS, list(rows))


_CALLS = (
    sa.select(tool_calls)
    .where(tool_calls.c.run_id == sa.bindparam("b_run"))
    .order_by(tool_calls.c.round, tool_calls.c.idx)
)

_CALLS_OF_ROUND = _CALLS.where(tool_calls.c.round == sa.bindparam("b_round"))

_CALL = sa.select(tool_calls).where(
    tool_calls.c.run_id == sa.bindparam("b_run"), tool_calls.c.call_id == sa.bindparam("b_call")
)

_ROUND_OF_CALL = _CALLS.where(
    tool_calls.c.round
    == sa.select(tool_calls.c.round)
    .where(
        tool_calls.c.run_id == sa.bindparam("b_run"),
        tool_calls.c.call_id == sa.bindparam("b_call"),
    )
    .scalar_subquery()
)


def list_tool_calls(conn: Connection, run_id: str, round_: int | None = None) -> list[Call]:
    q = _CALLS if round_ is None else _CALLS_OF_ROUND
    rows = conn.execute(q, {"b_run": run_id, "b_round": round_}).mappings()
    return [Call.of(r) for r in rows]


_CALL_COLUMNS = [c.label(f"call_{c.name}") for c in tool_calls.c]
_CALL_NAMES = [(c.name, f"call_{c.name}") for c in tool_calls.c]

# built once: a statement built per call pays SQLAlchemy's cache-key walk of its whole tree
_CALL_AND_RUN = (
    sa.select(runs, *_CALL_COLUMNS)
    .join(tool_calls, tool_calls.c.run_id == runs.c.id)
    .where(runs.c.id == sa.bindparam("b_run"), tool_calls.c.call_id == sa.bindparam("b_call"))
)


def call_and_run(conn: Connection, run_id: str, call_id: str) -> tuple[Run, Call] | None:
    """A tool call and its run, in one read (what a tool task starts from)."""
    row = conn.execute(_CALL_AND_RUN, {"b_run": run_id, "b_call": call_id}).mappings().first()
    if row is None:
        return None
    call = {name: row[label] for name, label in _CALL_NAMES}
    return Run.of(row), Call.of(call)


def call_ids_among(conn: Connection, run_id: str, ids: Sequence[str]) -> set[str]:
    """Which of ``ids`` the run's calls already use."""
    q = sa.select(tool_calls.c.call_id).where(
        tool_calls.c.run_id == run_id, tool_calls.c.call_id.in_(list(ids))
    )
    return {str(i) for i in conn.execute(q).scalars()}


def round_of_call(conn: Connection, run_id: str, call_id: str) -> list[Call]:
    """The calls of the round ``call_id`` belongs to, in order, in one read (empty: no such
    call)."""
    rows = conn.execute(_ROUND_OF_CALL, {"b_run": run_id, "b_call": call_id}).mappings()
    return [Call.of(r) for r in rows]


def get_call(conn: Connection, run_id: str, call_id: str) -> Call | None:
    row = conn.execute(_CALL, {"b_run": run_id, "b_call": call_id}).mappings().first()
    return Call.of(row) if row is not None else None


def claimable() -> Any:
    """SQL: the call ``:b_call`` of ``:b_run``, if it is queued or running under a worker that
    is gone (``:b_live_after``), locked; a row another transaction holds is skipped."""
    c = tool_calls.c
    return (
        sa.select(c.call_id)
        .where(
            c.run_id == sa.bindparam("b_run"),
            c.call_id == sa.bindparam("b_call"),
            sa.or_(
                c.status == CallStatus.QUEUED.value,
                sa.and_(
                    c.status == CallStatus.RUNNING.value,
                    sa.not_(live(c.lease_owner, sa.bindparam("b_live_after"))),
                ),
            ),
        )
        .with_for_update(skip_locked=True)
        .scalar_subquery()
    )


def claim_values() -> dict[str, Any]:
    """What a claim sets: running, one more attempt, the owner (``:b_owner``), first start."""
    c = tool_calls.c
    return {
        "status": CallStatus.RUNNING.value,
        "attempts": c.attempts + 1,
        "lease_owner": sa.bindparam("b_owner"),
        "started_at": sa.func.coalesce(c.started_at, sa.bindparam("b_ts", type_=sa.Float)),
    }


@lru_cache(maxsize=1)
def _claim() -> Any:
    c = tool_calls.c
    return (
        sa.update(tool_calls)
        .where(c.run_id == sa.bindparam("b_run"), c.call_id == claimable())
        .values(**claim_values())
        .returning(tool_calls)
    )


def claim_params(
    run_id: str, call_id: str, owner: str, ts: float, live_after: float
) -> dict[str, Any]:
    return {
        "b_run": run_id,
        "b_call": call_id,
        "b_owner": owner,
        "b_ts": ts,
        "b_live_after": live_after,
    }


def claim_call(
    conn: Connection, run_id: str, call_id: str, owner: str, ts: float, live_after: float
) -> Call | None:
    """Take a queued call, or a running one whose worker is gone; counts the attempt. A row
    another transaction holds is skipped (``SKIP LOCKED``), never waited for."""
    params = claim_params(run_id, call_id, owner, ts, live_after)
    row = conn.execute(_claim(), params).mappings().first()
    return Call.of(row) if row is not None else None


def claimed(call: Call, attempts: int, owner: str, started_at: float | None) -> Call:
    """``call`` as its claim left it (the columns the claim set, the rest as read)."""
    return replace(
        call,
        status=CallStatus.RUNNING,
        attempts=int(attempts),
        lease_owner=owner,
        started_at=started_at,
    )


def holds_call(conn: Connection, run_id: str, call_id: str, owner: str, attempt: int) -> bool:
    """``owner`` still holds the call's lease at ``attempt`` (nobody took it over)."""
    c = tool_calls.c
    q = sa.select(c.call_id).where(
        c.run_id == run_id,
        c.call_id == call_id,
        c.lease_owner == owner,
        c.attempts == attempt,
        c.status == CallStatus.RUNNING.value,
    )
    return conn.execute(q).first() is not None


def set_calls(
    conn: Connection,
    run_id: str,
    call_ids: Sequence[str],
    values: Mapping[str, Any],
    *,
    from_status: Sequence[CallStatus] | None = None,
    attempts: int | None = None,
) -> int:
    """Set ``values`` on calls (guarded by their status and, for a claimed call, its attempt:
    a fencing token); returns how many rows changed."""
    statuses = None if from_status is None else tuple(s.value for s in from_status)
    stmt = _close_statement(
        values_shape(values), statuses, attempts is not None, len(call_ids) == 1
    )
    params = calls_params(call_ids, values, "v_")
    params.update(b_run=run_id, b_attempts=attempts)
    return int(conn.execute(stmt, params).rowcount)


def values_shape(values: Mapping[str, Any]) -> tuple[tuple[str, bool], ...]:
    return tuple((name, v is None) for name, v in values.items())


def calls_params(call_ids: Sequence[str], values: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    params = {f"{prefix}{name}": v for name, v in values.items() if v is not None}
    if len(call_ids) == 1:
        params[f"{prefix}id"] = call_ids[0]
    else:
        params[f"{prefix}ids"] = list(call_ids)
    return params


def calls_update(
    shape: tuple[tuple[str, bool], ...], run: Any, prefix: str, single: bool = False
) -> Any:
    """UPDATE tool_calls of run ``run`` whose ids are ``:<prefix>ids`` (``single``: whose id
    is ``:<prefix>id``), setting each value of ``shape`` from ``:<prefix><column>`` (a None
    value is SQL NULL). One call (a tool task's) is a plain equality: an expanding ``IN``
    makes SQLAlchemy render the statement's text again on every execute."""
    c = tool_calls.c
    sets = {
        name: sa.null() if null else sa.bindparam(f"{prefix}{name}", type_=c[name].type)
        for name, null in shape
    }
    which = (
        c.call_id == sa.bindparam(f"{prefix}id")
        if single
        else c.call_id.in_(sa.bindparam(f"{prefix}ids", expanding=True))
    )
    return sa.update(tool_calls).where(c.run_id == run, which).values(**sets)


@lru_cache(maxsize=256)
def _close_statement(
    shape: tuple[tuple[str, bool], ...],
    statuses: tuple[str, ...] | None,
    fenced: bool,
    single: bool,
) -> Any:
    """``set_calls``' UPDATE for this shape of values (a None value is SQL NULL), status
    guard, fence and one call or several: built once per shape (a statement built per call
    costs more CPU than its round trip). The status guard is a disjunction of equalities, not
    ``IN``: no statement text rendered again per execute."""
    stmt = calls_update(shape, sa.bindparam("b_run"), "v_", single)
    return guarded(stmt, statuses, "b_attempts" if fenced else None)


def guarded(stmt: Any, statuses: tuple[str, ...] | None, fence: str | None) -> Any:
    """A calls UPDATE that changes only calls in one of ``statuses`` and (``fence``: the name
    of an attempt parameter) still at that attempt."""
    c = tool_calls.c
    if statuses is not None:
        stmt = stmt.where(sa.or_(*(c.status == s for s in statuses)))
    if fence is not None:
        stmt = stmt.where(c.attempts == sa.bindparam(fence, type_=sa.Integer))
    return stmt


def queue_calls(conn: Connection, run_id: str, call_ids: Sequence[str], ts: float) -> None:
    """Mark calls dispatched now (the reaper re-sends a dispatch nobody took)."""
    set_calls(conn, run_id, call_ids, {"status": CallStatus.QUEUED.value, "queued_at": ts})


def next_pending(conn: Connection, run_id: str, round_: int, ts: float) -> str | None:
    """Serial or windowed batches: mark the next undispatched call queued and return its id.
    A call another transaction is dispatching right now is skipped (``SKIP LOCKED``), so two
    finishers queue two different calls and never wait on each other's rows."""
    c = tool_calls.c
    nxt = conn.execute(
        sa.select(c.call_id)
        .where(c.run_id == run_id, c.round == round_, c.status == CallStatus.PENDING.value)
        .order_by(c.idx)
        .limit(1)
        .with_for_update(skip_locked=True)
    ).scalar()
    if nxt is None:
        return None
    done = set_calls(
        conn,
        run_id,
        [nxt],
        {"status": CallStatus.QUEUED.value, "queued_at": ts},
        from_status=[CallStatus.PENDING],
    )
    return str(nxt) if done == 1 else None
