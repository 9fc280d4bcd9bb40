"""The store on PostgreSQL (``shared.store.write.Store``'s hooks): the claim, a transition's
write and an answer's read, each in one statement."""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection

from shared.store import calls, runs
from shared.store.rows import Call, Run, RunRecord
from shared.store.tables import events, messages, run_specs, tool_calls, usage
from shared.store.tables import runs as runs_table
from shared.store.write import (
    ROUND_STARTED,
    TOOL_STARTED,
    Beside,
    Claimed,
    Prefetch,
    Store,
    Write,
    claim_due,
    claim_values,
    kind_of,
    update_statement,
)

__all__ = ["PostgresStore"]

_R = runs_table.c


class PostgresStore(Store):
    """PostgreSQL: the claim, a transition's write and an answer's read in one statement."""

    dialect = "postgresql"

    def _claim(self, conn: Connection, params: Any, ts: float, cold: bool) -> Claimed | None:
        """One statement: a run another transaction has locked is skipped, not waited for
        (``SKIP LOCKED``: whoever holds it publishes what comes next); the claim writes its
        ``round.started`` event; a cold claim reads the run's spec, inputs and own messages
        too (``Prefetch``)."""
        found = conn.execute(_pg_claim(cold), params).mappings().first()
        if found is None:
            return None
        since = max(float(found["was_updated"]), float(found["was_wake"] or 0.0))
        pre = None
        if cold:
            pre = Prefetch(found["pre_agent"], found["pre_inputs"], found["pre_messages"])
        return Claimed(Run.of(found), found["was_owner"] is not None, since, pre)

    def claim_call(
        self, conn: Connection, run: Run, call: Call, owner: str, ts: float, live_after: float
    ) -> tuple[Run, Call] | None:
        """One statement: the call's claim, the run's event seq and the ``tool.started``
        event; it returns the run and only the call's columns the claim set (the rest is as
        read: the run's version guard says nothing else moved). A claim whose run moved on
        returns nothing (its UPDATE of the call is rolled back by the caller)."""
        params = calls.claim_params(run.id, call.call_id, owner, ts, live_after)
        params.update(b_version=run.version, e_name=call.name, e_round=call.round)
        found = conn.execute(_pg_claim_call(), params).mappings().first()
        if found is None:
            return None
        took = calls.claimed(call, found["took_attempts"], owner, found["took_started"])
        return Run.of(found), took

    def _write(self, conn: Connection, w: Write) -> Run | None:
        """One statement when there are rows or calls beside the UPDATE (and JSON can carry
        their values): ``WITH u AS (UPDATE runs … RETURNING *), c0 AS (UPDATE tool_calls …),
        w0 AS (INSERT … SELECT … FROM u, json_to_recordset(:j_0)), … SELECT * FROM u``. A
        guarded closing's UPDATE comes first and gates the run's (the lock order: the run's
        calls, then its row)."""
        extra = _beside_params(w.beside) if w.beside or w.closing else None
        if extra is None:
            return super()._write(conn, w)
        for i, c in enumerate(w.closing):
            extra.update(calls.calls_params(c.call_ids, c.values, f"c{i}_"))
            if c.guarded:
                extra[f"c{i}_n"] = len(c.call_ids)
            if c.attempts is not None:
                extra[f"c{i}_attempts"] = c.attempts
        kinds = tuple((name, kind_of(v)) for name, v in w.vals.items())
        shape = tuple((b.table.name, tuple(b.rows[0]), b.seq) for b in w.beside)
        closes = tuple(
            (calls.values_shape(c.values), len(c.call_ids) == 1, c.statuses, c.attempts is not None)
            for c in w.closing
        )
        guard_shape = tuple((g, v is None) for g, v in w.guard.items())
        stmt = _pg_write(kinds, w.owner, guard_shape, shape, closes)
        row = conn.execute(stmt, {**w.params, **extra}).mappings().first()
        return Run.of(row) if row is not None else None

    def insert_ignoring(self, table: sa.Table, index: Sequence[Any]) -> Any:
        return postgresql.insert(table).on_conflict_do_nothing(index_elements=list(index))

    def run_and_round(
        self, conn: Connection, run_id: str, tenant: str | None, call_id: str
    ) -> tuple[RunRecord, list[Call]] | None:
        """One statement: the round's calls as a JSON column beside the record."""
        params = {"b_run": run_id, "b_tenant": tenant, "b_call": call_id}
        row = conn.execute(_pg_run_and_round(tenant is not None), params).mappings().first()
        if row is None:
            return None
        return runs.record_of(row), [Call.of(c) for c in row["round_calls"] or ()]


# the message columns a cold claim reads (``lineage.message_from_row`` and the seq)
_PREFETCHED: tuple[str, ...] = ("seq", "role", "content", "reasoning", "tool_calls")
_PREFETCHED += ("tool_call_id", "name", "hidden", "kind")


@lru_cache(maxsize=2)
def _pg_claim(cold: bool) -> Any:
    before = (
        sa.select(
            _R.id.label("id"),
            _R.lease_owner.label("was_owner"),
            _R.updated_at.label("was_updated"),
            _R.wake_at.label("was_wake"),
        )
        .where(*claim_due())
        .with_for_update(skip_locked=True)
        .subquery("before")
    )
    claimed = (
        sa.update(runs_table)
        .where(_R.id == before.c.id)
        .values(**claim_values())
        .returning(runs_table, before.c.was_owner, before.c.was_updated, before.c.was_wake)
        .cte("claimed")
    )
    started = (  # its round.started event, in the same statement
        sa.insert(events)
        .from_select(
            ["run_id", "seq", "type", "data", "created_at"],
            sa.select(
                claimed.c.id,
                claimed.c.event_seq,
                sa.literal(ROUND_STARTED),
                sa.func.json_build_object(
                    "round", sa.func.coalesce(claimed.c.loop["round"].as_integer(), 0) + 1
                ),
                sa.bindparam("b_ts", type_=sa.Float),
            ),
        )
        .cte("started")
    )
    if not cold:
        return sa.select(claimed).add_cte(started)
    of_run = run_specs.c.run_id == claimed.c.id
    m = messages.c
    row = sa.func.json_build_object(*[x for name in _PREFETCHED for x in (name, m[name])])
    rows = (
        sa.select(sa.func.json_agg(postgresql.aggregate_order_by(row, m.seq)))
        .where(m.run_id == claimed.c.id, m.seq >= claimed.c.view_start)
        .scalar_subquery()
    )
    return sa.select(
        claimed,
        sa.select(run_specs.c.agent).where(of_run).scalar_subquery().label("pre_agent"),
        sa.select(run_specs.c.inputs).where(of_run).scalar_subquery().label("pre_inputs"),
        sa.case((claimed.c.base_run_id.is_(None), rows), else_=None).label("pre_messages"),
    ).add_cte(started)


@lru_cache(maxsize=1)
def _pg_claim_call() -> Any:
    c = tool_calls.c
    took = (
        sa.update(tool_calls)
        .where(c.run_id == sa.bindparam("b_run"), c.call_id == calls.claimable())
        .values(**calls.claim_values())
        .returning(c.attempts, c.started_at)
        .cte("took")
    )
    u = (
        sa.update(runs_table)
        .where(
            _R.id == sa.bindparam("b_run"),
            _R.version == sa.bindparam("b_version"),
            sa.exists(sa.select(took.c.attempts)),
        )
        .values(updated_at=sa.bindparam("b_ts", type_=sa.Float), event_seq=_R.event_seq + 1)
        .returning(runs_table)
        .cte("u")
    )
    data = sa.func.json_build_object(
        "call_id", sa.bindparam("b_call", type_=sa.Text),
        "name", sa.bindparam("e_name", type_=sa.Text),
        "round", sa.bindparam("e_round", type_=sa.Integer),
        "attempt", took.c.attempts,
    )  # fmt: skip
    started = (  # its tool.started event (``write.tool_started``), in the same statement
        sa.insert(events)
        .from_select(
            ["run_id", "seq", "type", "data", "created_at"],
            sa.select(
                u.c.id,
                u.c.event_seq,
                sa.literal(TOOL_STARTED),
                data,
                sa.bindparam("b_ts", type_=sa.Float),
            ).select_from(u.join(took, sa.true())),
        )
        .cte("started")
    )
    return (
        sa.select(
            u, took.c.attempts.label("took_attempts"), took.c.started_at.label("took_started")
        )
        .select_from(u.join(took, sa.true()))
        .add_cte(started)
    )


_TABLES = {t.name: t for t in (messages, events, usage, tool_calls)}


_Close = tuple[tuple[tuple[str, bool], ...], bool, tuple[str, ...] | None, bool]
"""A closing's shape: its values' shape, one call or several, its status guard, its fence."""


@lru_cache(maxsize=256)
def _pg_write(
    kinds: tuple[tuple[str, str], ...],
    owner: bool,
    guard: tuple[tuple[str, bool], ...],
    shape: tuple[tuple[str, tuple[str, ...], str | None], ...],
    closes: tuple[_Close, ...],
) -> Any:
    """The guarded UPDATE with its rows beside and its calls' values, as one statement. A
    row's ``k`` (1…n) is its place: its seq is the run's new counter minus n plus k. A
    guarded closing updates its calls first, and the run's UPDATE applies only if it changed
    all ``:c<i>_n`` of them (the same lock order as a claim: the call, then the run)."""
    update = update_statement(kinds, owner, guard)
    gates: list[Any] = []
    after: list[tuple[int, Any, bool]] = []  # unguarded closings: joined to the run's row
    for i, (close, single, statuses, fenced) in enumerate(closes):
        if statuses is None and not fenced:
            after.append((i, close, single))
            continue
        stmt = calls.calls_update(close, sa.bindparam("b_run"), f"c{i}_", single)
        stmt = calls.guarded(stmt, statuses, f"c{i}_attempts" if fenced else None)
        gate = stmt.returning(tool_calls.c.call_id).cte(f"c{i}")
        gates.append(gate)
        n = sa.select(sa.func.count()).select_from(gate).scalar_subquery()
        update = update.where(n == sa.bindparam(f"c{i}_n", type_=sa.Integer))
    u = update.cte("u")
    ctes: list[Any] = [
        calls.calls_update(close, u.c.id, f"c{i}_", single).cte(f"c{i}")
        for i, close, single in after
    ]
    ctes += gates
    for i, (name, keys, seq) in enumerate(shape):
        table = _TABLES[name]
        cols = [sa.column(k, table.c[k].type) for k in keys]
        if seq is not None:
            cols.append(sa.column("k", sa.Integer))
        data = sa.cast(sa.bindparam(f"j_{i}", type_=sa.Text), sa.JSON)
        x = (
            sa.func.json_to_recordset(data)
            .table_valued(*cols)
            .render_derived(name=f"x{i}", with_types=True)
        )
        picked: list[Any] = [x.c[k] for k in keys]
        names = list(keys)
        if seq is not None:
            names.append("seq")
            picked.append(u.c[seq] - sa.bindparam(f"n_{i}", type_=sa.Integer) + x.c.k)
        rows = sa.select(*picked).select_from(u.join(x, sa.true()))
        ctes.append(sa.insert(table).from_select(names, rows).cte(f"w{i}"))
    return sa.select(u).add_cte(*ctes)


def _beside_params(beside: Sequence[Beside]) -> dict[str, Any] | None:
    """The JSON parameters of the rows beside an UPDATE; None when a value has no JSON form
    (a non-finite float): those go in their own INSERTs."""
    params: dict[str, Any] = {}
    try:
        for i, b in enumerate(beside):
            rows = b.rows if b.seq is None else [{**r, "k": n} for n, r in enumerate(b.rows, 1)]
            params[f"j_{i}"] = json.dumps(rows, allow_nan=False, separators=(",", ":"))
            if b.seq is not None:
                params[f"n_{i}"] = len(b.rows)
    except (TypeError, ValueError):
        return None
    return params


@lru_cache(maxsize=2)
def _pg_run_and_round(of_tenant: bool) -> Any:
    rc, rk = tool_calls.alias("rc"), tool_calls.alias("rk")
    run: Any = sa.bindparam("b_run")
    round_of = (
        sa.select(rk.c.round)
        .where(rk.c.run_id == run, rk.c.call_id == sa.bindparam("b_call"))
        .scalar_subquery()
    )
    row = sa.func.row_to_json(rc.table_valued())
    round_calls = (
        sa.select(sa.func.json_agg(postgresql.aggregate_order_by(row, rc.c.idx)))
        .where(rc.c.run_id == run, rc.c.round == round_of)
        .scalar_subquery()
        .label("round_calls")
    )
    return runs.record_query(of_tenant).add_columns(round_calls)
