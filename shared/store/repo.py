"""The SQL of runs, their messages, events, usage and tool calls. Every function works inside
the caller's transaction and returns typed rows (``shared.store.rows``).

A run's state changes only through ``update_run``: one guarded UPDATE of the hot row
(``WHERE version = V``, and the lease owner when the caller holds the round) that also
allocates the message and event sequence numbers, followed by append-only inserts. Who calls it,
in which lock order, and what follows, is ``shared.engine.transition``'s business.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from shared.agent.messages import Message
from shared.agent.tokens import estimate_message_tokens
from shared.store import lineage, tables
from shared.store.lineage import message_from_row
from shared.store.rows import RUNNABLE, Call, CallStatus, Run, RunRecord, Status
from shared.store.tables import events, messages, run_specs, runs, tool_calls, usage, workers

__all__ = [
    "call_and_run",
    "call_ids_among",
    "claim_call",
    "claim_round",
    "close_calls",
    "find_idempotent",
    "get_call",
    "get_run",
    "get_run_and_round",
    "holds_call",
    "Beside",
    "Closing",
    "Inc",
    "Prefetch",
    "insert_calls",
    "insert_events",
    "insert_messages",
    "insert_run",
    "insert_usage",
    "list_events",
    "list_events_of",
    "list_messages",
    "list_runs",
    "list_tool_calls",
    "load_run",
    "lock_run",
    "message_from_row",
    "message_rows",
    "message_tokens",
    "next_pending",
    "own_messages",
    "now",
    "queue_calls",
    "make_due",
    "release_round",
    "round_of_call",
    "round_started",
    "rows_beside",
    "ROUND_STARTED",
    "run_meta",
    "run_spec",
    "run_trace",
    "set_agent",
    "set_base",
    "set_inputs",
    "spec_rev",
    "update_run",
]


def now() -> float:
    return time.time()


def _live(owner: Any, live_after: Any) -> Any:
    """SQL: the lease ``owner`` column names a worker whose heartbeat is fresh."""
    fresh = sa.select(workers.c.id).where(workers.c.seen_at >= live_after)
    return sa.and_(owner.is_not(None), owner.in_(fresh.scalar_subquery()))


# --- runs ------------------------------------------------------------------------------------


def insert_run(
    conn: Connection,
    row: dict[str, Any],
    spec: dict[str, Any],
    msgs: Sequence[Message],
    ts: float,
    *,
    if_absent: bool = False,
) -> bool:
    """Insert a run, what it was given and its first messages. ``if_absent``: ``INSERT ... ON
    CONFLICT (id) DO NOTHING`` (a run id derived from its cause, e.g. a child run's);
    False = it existed. A run with a base (``row["base_seq"]``, ``shared.store.lineage``)
    numbers its messages after the base's; ``row["view_tokens"]`` then counts the base's
    part of the model view."""
    tokens = sum(estimate_message_tokens(m) for m in msgs)
    first = int(row.get("base_seq") or 0) + 1
    values = {
        **row,
        "msg_seq": first - 1 + len(msgs),
        "view_tokens": int(row.get("view_tokens") or 0) + tokens,
        "created_at": ts,
        "updated_at": ts,
    }
    if if_absent:
        if conn.execute(_insert_if_absent(conn, values)).first() is None:
            return False
    else:
        conn.execute(sa.insert(runs).values(**values))
    conn.execute(sa.insert(run_specs).values(run_id=row["id"], **spec))
    start = int(row.get("round") or 0)  # a fork starts at its source's round
    insert_messages(conn, row["id"], first, [(m, start) for m in msgs], ts)
    return True


def _insert_if_absent(conn: Connection, values: dict[str, Any]) -> Any:
    insert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
    return (
        insert(runs)
        .values(**values)
        .on_conflict_do_nothing(index_elements=[runs.c.id])
        .returning(runs.c.id)
    )


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


def _record(row: Mapping[Any, Any]) -> RunRecord:
    return RunRecord(
        Run.of(row), row["agent"], row["inputs"], row["meta"], row["warnings"], row["agent_ref"]
    )


_GET = _RECORD.where(_BY_ID)
_GET_OF_TENANT = _GET.where(_OF_TENANT)


def _round_calls() -> Any:
    """The calls of the round ``:b_call`` belongs to, as a JSON array in call order."""
    rc, rk = tool_calls.alias("rc"), tool_calls.alias("rk")
    run: Any = sa.bindparam("b_run")
    round_of = (
        sa.select(rk.c.round)
        .where(rk.c.run_id == run, rk.c.call_id == sa.bindparam("b_call"))
        .scalar_subquery()
    )
    row = sa.func.row_to_json(rc.table_valued())
    return (
        sa.select(sa.func.json_agg(postgresql.aggregate_order_by(row, rc.c.idx)))
        .where(rc.c.run_id == run, rc.c.round == round_of)
        .scalar_subquery()
        .label("round_calls")
    )


_GET_ROUND = _GET.add_columns(_round_calls())
_GET_ROUND_OF_TENANT = _GET_ROUND.where(_OF_TENANT)


def get_run_and_round(
    conn: Connection, run_id: str, tenant: str | None, call_id: str
) -> tuple[RunRecord, list[Call]] | None:
    """The run as the API shows it and the calls of the round ``call_id`` belongs to (what
    an answer reads), in one statement on PostgreSQL."""
    if conn.dialect.name != "postgresql":
        record = get_run(conn, run_id, tenant)
        return None if record is None else (record, round_of_call(conn, run_id, call_id))
    q = _GET_ROUND if tenant is None else _GET_ROUND_OF_TENANT
    params = {"b_run": run_id, "b_tenant": tenant, "b_call": call_id}
    row = conn.execute(q, params).mappings().first()
    if row is None:
        return None
    return _record(row), [Call.of(c) for c in row["round_calls"] or ()]


def get_run(conn: Connection, run_id: str, tenant: str | None = None) -> RunRecord | None:
    """The run as the API shows it: its hot row and what it was given."""
    q = _GET if tenant is None else _GET_OF_TENANT
    row = conn.execute(q, {"b_run": run_id, "b_tenant": tenant}).mappings().first()
    return _record(row) if row is not None else None


def find_idempotent(conn: Connection, tenant: str, key: str) -> RunRecord | None:
    q = _RECORD.where(runs.c.tenant == tenant, runs.c.idempotency_key == key)
    row = conn.execute(q).mappings().first()
    return _record(row) if row is not None else None


def list_runs(
    conn: Connection,
    tenant: str,
    *,
    status: str | None = None,
    thread_id: str | None = None,
    limit: int = 50,
    before: tuple[float, str] | None = None,
) -> list[RunRecord]:
    q = _RECORD.where(runs.c.tenant == tenant)
    if status:
        q = q.where(runs.c.status == status)
    if thread_id:
        q = q.where(runs.c.thread_id == thread_id)
    if before:
        ts, rid = before
        q = q.where(
            sa.or_(runs.c.created_at < ts, sa.and_(runs.c.created_at == ts, runs.c.id < rid))
        )
    q = q.order_by(runs.c.created_at.desc(), runs.c.id.desc()).limit(limit)
    return [_record(r) for r in conn.execute(q).mappings()]


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


def _literals(values: Sequence[str]) -> list[Any]:
    """Constant SQL literals for an ``IN`` list of internal names (no bind parameter to expand
    at each execution)."""
    return [sa.literal_column(f"'{v}'") for v in values]


ROUND_STARTED = "round.started"


def round_started(run: Run) -> dict[str, Any]:
    """The data of the ``round.started`` event a claim of ``run`` writes."""
    return {"round": int((run.loop or {}).get("round") or 0) + 1}


def _claim_due() -> tuple[Any, ...]:
    """The WHERE of a round claim (``claim_round``), with bind parameters."""
    r = runs.c
    return (
        r.id == sa.bindparam("b_run"),
        r.version == sa.bindparam("b_version"),
        r.status.in_(_literals([s.value for s in RUNNABLE])),
        r.open_calls == 0,
        r.held == sa.false(),
        sa.or_(r.wake_at.is_(None), r.wake_at <= sa.bindparam("b_ts")),
        sa.not_(_live(r.lease_owner, sa.bindparam("b_live_after"))),
    )


def _claim_values() -> dict[str, Any]:
    r = runs.c
    return {
        "status": Status.RUNNING.value,
        "lease_owner": sa.bindparam("b_owner"),
        "wake_at": None,
        "redrives": 0,
        "attempts": r.attempts + 1,  # L-12: every claim counts; the round's commit resets
        "updated_at": sa.bindparam("b_ts"),
        "event_seq": r.event_seq + 1,
    }


# the message columns a cold claim reads (``lineage.message_from_row`` and the seq)
_PREFETCHED = (
    "seq",
    "role",
    "content",
    "reasoning",
    "tool_calls",
    "tool_call_id",
    "name",
    "hidden",
    "kind",
)


@dataclass(frozen=True, slots=True)
class Prefetch:
    """What a cold claim read in its own statement: the run's spec and inputs, and its own
    messages from its view's start (``messages`` None: not read, the run has a base)."""

    agent: dict[str, Any]
    inputs: dict[str, Any] | None
    messages: list[dict[str, Any]] | None


def _claim_statements() -> tuple[Any, Any, Any, Any]:
    """Built once: a hot statement built per call costs more CPU than its round trip."""
    r = runs.c
    before = (
        sa.select(
            r.id.label("id"),
            r.lease_owner.label("was_owner"),
            r.updated_at.label("was_updated"),
            r.wake_at.label("was_wake"),
        )
        .where(*_claim_due())
        .with_for_update(skip_locked=True)
        .subquery("before")
    )
    claimed = (
        sa.update(runs)
        .where(r.id == before.c.id)
        .values(**_claim_values())
        .returning(runs, before.c.was_owner, before.c.was_updated, before.c.was_wake)
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
    postgres = sa.select(claimed).add_cte(started)
    # a cold claim (this process holds nothing of the run): its spec, inputs and own messages
    # come back with it, in the same round trip
    of_run = run_specs.c.run_id == claimed.c.id
    m = messages.c
    row = sa.func.json_build_object(*[x for name in _PREFETCHED for x in (name, m[name])])
    rows = (
        sa.select(sa.func.json_agg(postgresql.aggregate_order_by(row, m.seq)))
        .where(m.run_id == claimed.c.id, m.seq >= claimed.c.view_start)
        .scalar_subquery()
    )
    cold = sa.select(
        claimed,
        sa.select(run_specs.c.agent).where(of_run).scalar_subquery().label("pre_agent"),
        sa.select(run_specs.c.inputs).where(of_run).scalar_subquery().label("pre_inputs"),
        sa.case((claimed.c.base_run_id.is_(None), rows), else_=None).label("pre_messages"),
    ).add_cte(started)
    # SQLite: one writer at a time, RETURNING plain
    was = sa.select(r.lease_owner, r.updated_at, r.wake_at).where(*_claim_due())
    take = (
        sa.update(runs)
        .where(r.id == sa.bindparam("b_run"))
        .values(**_claim_values())
        .returning(runs)
    )
    return postgres, cold, was, take


_CLAIM, _CLAIM_COLD, _CLAIM_WAS, _CLAIM_TAKE = _claim_statements()


def claim_round(
    conn: Connection,
    run_id: str,
    version: int,
    owner: str,
    ts: float,
    live_after: float,
    *,
    cold: bool = False,
) -> tuple[Run, bool, float, Prefetch | None] | None:
    """Take the round: the run is at ``version``, runnable, no tools open, not held, due, and
    no live worker holds it. The same UPDATE takes an event seq (``round.started``). A run
    another transaction has locked is skipped, not waited for (``SKIP LOCKED``): whoever
    holds it publishes what comes next. Returns the run, whether the round was taken from
    a worker that died holding it (its model call was abandoned), and since when the round
    was due (its queue wait starts there). The claim writes the round's ``round.started``
    event at the seq it takes (``round_started``: its data). ``cold``: this process holds
    nothing of the run; on PostgreSQL the same statement reads its spec, inputs and own
    messages too (``Prefetch``; None otherwise)."""
    params = {
        "b_run": run_id,
        "b_version": version,
        "b_owner": owner,
        "b_ts": ts,
        "b_live_after": live_after,
    }
    if conn.dialect.name != "postgresql":
        was = conn.execute(_CLAIM_WAS, params).first()
        if was is None:
            return None
        run = Run.of(conn.execute(_CLAIM_TAKE, params).mappings().one())
        insert_events(conn, run.id, run.event_seq, [(ROUND_STARTED, round_started(run))], ts)
        return run, was[0] is not None, max(was[1], was[2] or 0.0), None
    found = conn.execute(_CLAIM_COLD if cold else _CLAIM, params).mappings().first()
    if found is None:
        return None
    since = max(float(found["was_updated"]), float(found["was_wake"] or 0.0))
    pre = Prefetch(found["pre_agent"], found["pre_inputs"], found["pre_messages"]) if cold else None
    return Run.of(found), found["was_owner"] is not None, since, pre


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


@dataclass(frozen=True, slots=True)
class Inc:
    """An ``update_run`` value: the column's value plus ``by`` (computed by the UPDATE)."""

    by: float


_UPDATES: dict[tuple[Any, ...], Any] = {}
_UPDATE_SHAPES_MAX = 256  # shapes come from the code's transitions: a few dozen


def _update_key(
    values: Mapping[str, Any], owner: bool, guard: Mapping[str, Any]
) -> tuple[Any, ...]:
    """The shape of a guarded UPDATE: what its statement is cached under."""
    shape = tuple(
        (name, "expr" if isinstance(v, sa.ColumnElement) else _kind(v))
        for name, v in values.items()
    )
    return (shape, owner, tuple((g, v is None) for g, v in guard.items()))


def _update_statement(
    values: Mapping[str, Any],
    owner: bool,
    guard: Mapping[str, Any],
    key: tuple[Any, ...] | None = None,
) -> Any:
    """The guarded UPDATE … RETURNING for this shape of values (``key``: ``_update_key``):
    bind parameters for the values (``None`` is SQL NULL, ``Inc`` adds), built once per
    shape; a value that is an SQL expression is written into a statement built for this call
    alone."""
    key = key or _update_key(values, owner, guard)
    shape = key[0]
    stmt = _UPDATES.get(key)
    if stmt is not None:
        return stmt
    r = runs.c
    sets: dict[str, Any] = {}
    for name, kind in shape:
        param = sa.bindparam(f"v_{name}", type_=r[name].type)
        sets[name] = {"expr": values[name], "null": sa.null(), "inc": r[name] + param}.get(
            kind, param
        )
    where = [r.id == sa.bindparam("b_run"), r.version == sa.bindparam("b_version")]
    if owner:
        where.append(r.lease_owner == sa.bindparam("b_owner"))
    for g, value in guard.items():
        where.append(r[g].is_(None) if value is None else r[g] == sa.bindparam(f"g_{g}"))
    stmt = sa.update(runs).where(*where).values(**sets).returning(runs)
    if len(_UPDATES) < _UPDATE_SHAPES_MAX and all(kind != "expr" for _, kind in shape):
        _UPDATES[key] = stmt
    return stmt


@dataclass(frozen=True, slots=True)
class Beside:
    """Rows a transition inserts beside its guarded UPDATE of the run: on PostgreSQL in the
    same statement (a data-modifying CTE per table, the rows passed as one JSON parameter,
    nothing inserted when the guard fails). ``seq``: the run counter (``msg_seq``,
    ``event_seq``) whose last ``len(rows)`` values, allocated by the UPDATE, number them."""

    table: sa.Table
    rows: list[dict[str, Any]]
    seq: str | None = None


@dataclass(frozen=True, slots=True)
class Closing:
    """Values set on tool calls beside a transition's UPDATE of their run (in the same
    statement on PostgreSQL; a None value is SQL NULL)."""

    call_ids: list[str]
    values: dict[str, Any]


def rows_beside(
    run_id: str,
    ts: float,
    *,
    messages: Sequence[tuple[Message, int]] = (),
    tokens: Sequence[int] | None = None,
    events: Sequence[tuple[str, dict[str, Any]]] = (),
    usage: Sequence[Mapping[str, Any]] = (),
    calls: Sequence[Mapping[str, Any]] = (),
) -> list[Beside]:
    """A transition's new rows, to insert beside its UPDATE of the run (``update_run``)."""
    return [
        Beside(tables.messages, message_rows(run_id, messages, ts, tokens), "msg_seq"),
        Beside(
            tables.events,
            [{"run_id": run_id, "type": t, "data": d, "created_at": ts} for t, d in events],
            "event_seq",
        ),
        Beside(tables.usage, [{"run_id": run_id, "created_at": ts, **u} for u in usage]),
        Beside(tool_calls, [dict(c) for c in calls]),
    ]


_WRITES: dict[tuple[Any, ...], Any] = {}
_Shape = tuple[tuple[sa.Table, tuple[str, ...], str | None], ...]  # per table: columns, seq
_Closes = tuple[tuple[tuple[str, bool], ...], ...]  # per closing: (column, is None)


def _write_statement(update: Any, key: tuple[Any, ...], shape: _Shape, closes: _Closes) -> Any:
    """The guarded UPDATE (``key``: its ``_update_key``) with its rows beside (``Beside``)
    and its calls' closings (``Closing``), built once per shape of a cacheable UPDATE:
    ``WITH u AS (UPDATE runs … RETURNING *), c0 AS (UPDATE tool_calls … FROM u WHERE …),
    w0 AS (INSERT INTO … SELECT … FROM u, json_to_recordset(:j_0) AS x(…)), … SELECT * FROM
    u``. A row's ``k`` (1…n) is its place: its seq is the run's new counter minus n plus k."""
    cached = key in _UPDATES  # no SQL expression among the values
    stmt = _WRITES.get((key, shape, closes)) if cached else None
    if stmt is not None:
        return stmt
    u = update.cte("u")
    ctes = [_calls_update(close, u.c.id, f"c{i}_").cte(f"c{i}") for i, close in enumerate(closes)]
    for i, (table, keys, seq) in enumerate(shape):
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
    stmt = sa.select(u).add_cte(*ctes)
    if cached and len(_WRITES) < _UPDATE_SHAPES_MAX:
        _WRITES[(key, shape, closes)] = stmt
    return stmt


def _beside_params(beside: Sequence[Beside]) -> dict[str, Any] | None:
    """The JSON parameters of the rows beside an UPDATE; None when a value has no JSON form
    (a non-finite float): those go in their own INSERTs."""
    params: dict[str, Any] = {}
    try:
        for i, b in enumerate(x for x in beside if x.rows):
            rows = b.rows if b.seq is None else [{**r, "k": n} for n, r in enumerate(b.rows, 1)]
            params[f"j_{i}"] = json.dumps(rows, allow_nan=False, separators=(",", ":"))
            if b.seq is not None:
                params[f"n_{i}"] = len(b.rows)
    except (TypeError, ValueError):
        return None
    return params


def _insert_beside(conn: Connection, run: Run, b: Beside) -> None:
    """The rows beside an UPDATE in their own INSERT (SQLite; a value JSON cannot carry)."""
    if not b.rows:
        return
    rows = b.rows
    if b.seq is not None:
        last = int(getattr(run, b.seq))
        first = last - len(rows) + 1
        rows = [{**r, "seq": first + i} for i, r in enumerate(rows)]
    conn.execute(sa.insert(b.table), rows)


def _kind(value: Any) -> str:
    return "inc" if isinstance(value, Inc) else "null" if value is None else "value"


def update_run(
    conn: Connection,
    run_id: str,
    version: int,
    values: Mapping[str, Any],
    *,
    owner: str | None = None,
    guard: Mapping[str, Any] | None = None,
    bump: bool = True,
    new_messages: int = 0,
    new_events: int = 0,
    ts: float,
    beside: Sequence[Beside] = (),
    closing: Sequence[Closing] = (),
) -> Run | None:
    """The guarded UPDATE of a transition: applies if the run is still at ``version`` (and
    ``owner`` still holds its round, and each ``guard`` column still has its value); None =
    lost the race. Allocates ``new_messages``
    message seqs and ``new_events`` event seqs (the returned row's last ones). A value may be
    ``Inc(n)``: the column plus n. ``beside``: rows inserted with it when it applies;
    ``closing``: values set on the run's calls (one statement on PostgreSQL)."""
    vals: dict[str, Any] = {**values, "updated_at": ts}
    if new_messages:
        vals["msg_seq"] = Inc(new_messages)
    if new_events:
        vals["event_seq"] = Inc(new_events)
    if bump:
        vals["version"] = Inc(1)
    guard = guard or {}
    params = {f"v_{k}": v.by if isinstance(v, Inc) else v for k, v in vals.items()}
    params.update({f"g_{k}": v for k, v in guard.items()})
    params.update(b_run=run_id, b_version=version, b_owner=owner)
    key = _update_key(vals, owner is not None, guard)
    stmt = _update_statement(vals, owner is not None, guard, key)
    beside = [b for b in beside if b.rows]
    closing = [c for c in closing if c.call_ids]
    if (beside or closing) and conn.dialect.name == "postgresql":
        extra = _beside_params(beside)
        if extra is not None:
            shape = tuple((b.table, tuple(b.rows[0]), b.seq) for b in beside)
            for i, c in enumerate(closing):
                extra.update(_calls_params(c.call_ids, c.values, f"c{i}_"))
            write = _write_statement(
                stmt, key, shape, tuple(_values_shape(c.values) for c in closing)
            )
            row = conn.execute(write, {**params, **extra}).mappings().first()
            return Run.of(row) if row is not None else None
    for c in closing:
        close_calls(conn, run_id, c.call_ids, c.values)
    row = conn.execute(stmt, params).mappings().first()
    if row is None:
        return None
    new = Run.of(row)
    for b in beside:
        _insert_beside(conn, new, b)
    return new


# --- messages, events, usage ------------------------------------------------------------------

# the hot inserts, built once (a statement built per call costs CPU on every round)
_INSERT_MESSAGES = sa.insert(messages)
_INSERT_EVENTS = sa.insert(events)
_INSERT_USAGE = sa.insert(usage)
_INSERT_CALLS = sa.insert(tool_calls)


def message_tokens(msgs: Sequence[tuple[Message, int]]) -> list[int]:
    """The estimated token count of each message (stored once, with the message)."""
    return [estimate_message_tokens(m) for m, _ in msgs]


def insert_messages(
    conn: Connection,
    run_id: str,
    first_seq: int,
    msgs: Sequence[tuple[Message, int]],
    ts: float,
    tokens: Sequence[int] | None = None,
) -> None:
    if not msgs:
        return
    rows = message_rows(run_id, msgs, ts, tokens)
    conn.execute(_INSERT_MESSAGES, [{**r, "seq": first_seq + i} for i, r in enumerate(rows)])


def message_rows(
    run_id: str, msgs: Sequence[tuple[Message, int]], ts: float, tokens: Sequence[int] | None
) -> list[dict[str, Any]]:
    """The ``messages`` rows of these messages, without their seqs."""
    counts = tokens if tokens is not None else message_tokens(msgs)
    rows = []
    for (m, round_), n in zip(msgs, counts, strict=True):
        rows.append(
            {
                "run_id": run_id,
                "round": round_,
                "role": m.role,
                "content": m.content,
                "reasoning": m.reasoning or None,
                "tool_calls": [c.to_dict() for c in m.tool_calls] or None,
                "tool_call_id": m.tool_call_id,
                "name": m.name,
                "hidden": m.hidden,
                "kind": m.kind,
                "tokens": n,
                "created_at": ts,
            }
        )
    return rows


def list_messages(
    conn: Connection, run_id: str, from_seq: int = 0, *, raw: bool = False
) -> list[Mapping[Any, Any]]:
    """The run's transcript from ``from_seq``: its base's messages, read by reference, then
    its own (``shared.store.lineage``; ``raw``: a thread's history as it was written)."""
    return lineage.read(conn, run_id, from_seq, raw=raw)


def own_messages(conn: Connection, run_id: str, from_seq: int = 0) -> list[Mapping[Any, Any]]:
    """The messages the run itself wrote (not its base's)."""
    return list(conn.execute(_OWN_MESSAGES, {"b_run": run_id, "b_from": from_seq}).mappings())


_OWN_MESSAGES = (
    sa.select(messages)
    .where(messages.c.run_id == sa.bindparam("b_run"), messages.c.seq >= sa.bindparam("b_from"))
    .order_by(messages.c.seq)
)


def insert_events(
    conn: Connection,
    run_id: str,
    first_seq: int,
    evs: Sequence[tuple[str, dict[str, Any]]],
    ts: float,
) -> list[tuple[int, str, dict[str, Any]]]:
    """The event rows, numbered from ``first_seq``; returns them as (seq, type, data)."""
    numbered = [(first_seq + i, t, d) for i, (t, d) in enumerate(evs)]
    if numbered:
        conn.execute(
            _INSERT_EVENTS,
            [
                {"run_id": run_id, "seq": seq, "type": t, "data": d, "created_at": ts}
                for seq, t, d in numbered
            ],
        )
    return numbered


def list_events(
    conn: Connection, run_id: str, after: int = 0, limit: int = 1000
) -> list[Mapping[Any, Any]]:
    q = (
        sa.select(events)
        .where(events.c.run_id == run_id, events.c.seq > after)
        .order_by(events.c.seq)
        .limit(limit)
    )
    return list(conn.execute(q).mappings())


def list_events_of(conn: Connection, run_id: str, types: Sequence[str]) -> list[Mapping[Any, Any]]:
    """The run's events of these types, in order."""
    q = (
        sa.select(events)
        .where(events.c.run_id == run_id, events.c.type.in_(list(types)))
        .order_by(events.c.seq)
    )
    return list(conn.execute(q).mappings())


def insert_usage(
    conn: Connection, run_id: str, rows: Sequence[Mapping[str, Any]], ts: float
) -> None:
    if rows:
        conn.execute(_INSERT_USAGE, [{"run_id": run_id, "created_at": ts, **u} for u in rows])


# --- tool calls ---------------------------------------------------------------------------------


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


def call_and_run(conn: Connection, run_id: str, call_id: str) -> tuple[Run, Call] | None:
    """A tool call and its run, in one read (what a tool task starts from)."""
    q = (
        sa.select(runs, *_CALL_COLUMNS)
        .join(tool_calls, tool_calls.c.run_id == runs.c.id)
        .where(runs.c.id == run_id, tool_calls.c.call_id == call_id)
    )
    row = conn.execute(q).mappings().first()
    if row is None:
        return None
    call = {c.name: row[f"call_{c.name}"] for c in tool_calls.c}
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


def claim_call(
    conn: Connection, run_id: str, call_id: str, owner: str, ts: float, live_after: float
) -> Call | None:
    """Take a queued call, or a running one whose worker is gone; counts the attempt. A row
    another transaction holds is skipped (``SKIP LOCKED``), never waited for."""
    c = tool_calls.c
    target = (
        sa.select(c.call_id)
        .where(
            c.run_id == run_id,
            c.call_id == call_id,
            sa.or_(
                c.status == CallStatus.QUEUED.value,
                sa.and_(
                    c.status == CallStatus.RUNNING.value, sa.not_(_live(c.lease_owner, live_after))
                ),
            ),
        )
        .with_for_update(skip_locked=True)
        .scalar_subquery()
    )
    stmt = (
        sa.update(tool_calls)
        .where(c.run_id == run_id, c.call_id == target)
        .values(
            status=CallStatus.RUNNING.value,
            attempts=c.attempts + 1,
            lease_owner=owner,
            started_at=sa.func.coalesce(c.started_at, ts),
        )
        .returning(tool_calls)
    )
    row = conn.execute(stmt).mappings().first()
    return Call.of(row) if row is not None else None


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


def close_calls(
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
    stmt = _close_statement(_values_shape(values), statuses, attempts is not None)
    params = _calls_params(call_ids, values, "v_")
    params.update(b_run=run_id, b_attempts=attempts)
    return int(conn.execute(stmt, params).rowcount)


def _values_shape(values: Mapping[str, Any]) -> tuple[tuple[str, bool], ...]:
    return tuple((name, v is None) for name, v in values.items())


def _calls_params(
    call_ids: Sequence[str], values: Mapping[str, Any], prefix: str
) -> dict[str, Any]:
    params = {f"{prefix}{name}": v for name, v in values.items() if v is not None}
    params[f"{prefix}ids"] = list(call_ids)
    return params


def _calls_update(shape: tuple[tuple[str, bool], ...], run: Any, prefix: str) -> Any:
    """UPDATE tool_calls of run ``run`` whose ids are ``:<prefix>ids``, setting each value of
    ``shape`` from ``:<prefix><column>`` (a None value is SQL NULL)."""
    c = tool_calls.c
    sets = {
        name: sa.null() if null else sa.bindparam(f"{prefix}{name}", type_=c[name].type)
        for name, null in shape
    }
    ids: Any = sa.bindparam(f"{prefix}ids", expanding=True)
    return sa.update(tool_calls).where(c.run_id == run, c.call_id.in_(ids)).values(**sets)


_CLOSES: dict[tuple[Any, ...], Any] = {}


def _close_statement(
    shape: tuple[tuple[str, bool], ...], statuses: tuple[str, ...] | None, fenced: bool
) -> Any:
    """``close_calls``' UPDATE for this shape of values (a None value is SQL NULL), status
    guard and fence, built once."""
    key = (shape, statuses, fenced)
    stmt = _CLOSES.get(key)
    if stmt is not None:
        return stmt
    c = tool_calls.c
    stmt = _calls_update(shape, sa.bindparam("b_run"), "v_")
    if statuses is not None:
        stmt = stmt.where(c.status.in_(_literals(statuses)))
    if fenced:
        stmt = stmt.where(c.attempts == sa.bindparam("b_attempts"))
    if len(_CLOSES) < _UPDATE_SHAPES_MAX:
        _CLOSES[key] = stmt
    return stmt


def queue_calls(conn: Connection, run_id: str, call_ids: Sequence[str], ts: float) -> None:
    """Mark calls dispatched now (the reaper re-sends a dispatch nobody took)."""
    close_calls(conn, run_id, call_ids, {"status": CallStatus.QUEUED.value, "queued_at": ts})


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
    done = close_calls(
        conn,
        run_id,
        [nxt],
        {"status": CallStatus.QUEUED.value, "queued_at": ts},
        from_status=[CallStatus.PENDING],
    )
    return str(nxt) if done == 1 else None
