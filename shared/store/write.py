"""The writes of a transition, and the round's claim: the store's one face whose SQL differs by
dialect (as DBOS's system database: one object owning the SQL, a PostgreSQL subclass —
``shared.store.postgres`` — overriding narrow hooks). The runtime holds one
(``shared.store.store_for``).

- ``claim_round``: the conditional UPDATE that takes a round (``WHERE version = V`` and
  runnable, due, not held by a live worker), counting an attempt and taking the seq of its
  ``round.started`` event. PostgreSQL: one statement that skips a locked row, writes the
  event, and on a cold claim reads the run's spec, inputs and messages too; SQLite (one
  writer at a time): a read, the UPDATE, the event.
- ``claim_call``: a tool task's claim of its call (queued, or running under a worker that is
  gone), with the run's event seq and its ``tool.started`` event. PostgreSQL: one statement
  that returns only what the claim set; SQLite: the call's UPDATE, the run's, the event.
- ``update_run``: the guarded UPDATE of a transition (``WHERE version = V``, the lease owner,
  ``guard`` columns) that allocates message and event seqs, with the rows the transition
  appends and the values it sets on the run's calls. PostgreSQL: one statement (a
  data-modifying CTE per table, the rows as one JSON parameter: nothing is written when the
  guard fails); SQLite: the UPDATE, then the INSERTs.
- ``insert_run`` (``if_absent``: ``ON CONFLICT DO NOTHING``), ``run_and_round``.

Statements are built once per shape (``functools.lru_cache`` on pure builders, bounded and
evicting): a statement built per call costs more CPU than its round trip.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import Connection

from shared.agent.messages import Message
from shared.agent.tokens import estimate_message_tokens
from shared.store import calls, runs
from shared.store.records import insert_events, insert_messages, message_rows, usage_rows
from shared.store.rows import RUNNABLE, Call, CallStatus, Run, RunRecord, Status
from shared.store.tables import events, messages, run_specs, tool_calls, usage
from shared.store.tables import runs as runs_table
from shared.vocab import EventType

__all__ = [
    "ROUND_STARTED",
    "TOOL_STARTED",
    "Beside",
    "Claimed",
    "Closing",
    "Inc",
    "Prefetch",
    "Store",
    "Write",
    "claim_due",
    "claim_params",
    "claim_values",
    "kind_of",
    "update_statement",
    "round_started",
    "rows_beside",
    "tool_started",
]

ROUND_STARTED = EventType.ROUND_STARTED.value
TOOL_STARTED = EventType.TOOL_STARTED.value
_R = runs_table.c


def round_started(run: Run) -> dict[str, Any]:
    """The data of the ``round.started`` event a claim of ``run`` writes."""
    return {"round": int((run.loop or {}).get("round") or 0) + 1}


def tool_started(call: Call) -> dict[str, Any]:
    """The data of the ``tool.started`` event a claim of ``call`` (as claimed) writes."""
    return {
        "call_id": call.call_id,
        "name": call.name,
        "round": call.round,
        "attempt": call.attempts,
    }


@dataclass(frozen=True, slots=True)
class Inc:
    """An ``update_run`` value: the column's value plus ``by`` (computed by the UPDATE)."""

    by: float


@dataclass(frozen=True, slots=True)
class Beside:
    """Rows a transition inserts beside its guarded UPDATE of the run. ``seq``: the run
    counter (``msg_seq``, ``event_seq``) whose last ``len(rows)`` values, allocated by the
    UPDATE, number them."""

    table: sa.Table
    rows: list[dict[str, Any]]
    seq: str | None = None


@dataclass(frozen=True, slots=True)
class Closing:
    """Values set on tool calls beside a transition's UPDATE of their run (a None value is
    SQL NULL). Guarded (``from_status``, ``attempts``): the transition is lost unless every
    call is still in one of those statuses and, for a claimed call, at that attempt (its
    fence)."""

    call_ids: list[str]
    values: dict[str, Any]
    from_status: tuple[CallStatus, ...] | None = None
    attempts: int | None = None

    @property
    def guarded(self) -> bool:
        return self.from_status is not None or self.attempts is not None

    @property
    def statuses(self) -> tuple[str, ...] | None:
        return None if self.from_status is None else tuple(s.value for s in self.from_status)


@dataclass(frozen=True, slots=True)
class Write:
    """``update_run``'s UPDATE, ready for a dialect's ``_write``: the values, whether it is
    guarded by an owner and by which columns, the statement's parameters, and the non-empty
    rows beside it and calls it closes."""

    vals: Mapping[str, Any]
    owner: bool
    guard: Mapping[str, Any]
    params: dict[str, Any]
    beside: Sequence[Beside]
    closing: Sequence[Closing]


@dataclass(frozen=True, slots=True)
class Prefetch:
    """What a cold claim read in its own statement: the run's spec and inputs, and its own
    messages from its view's start (``messages`` None: not read, the run has a base)."""

    agent: dict[str, Any]
    inputs: dict[str, Any] | None
    messages: list[dict[str, Any]] | None


@dataclass(frozen=True, slots=True)
class Claimed:
    """A round taken: the run, whether a worker that died held it (its model call was
    abandoned), since when it was due (its queue wait), and a cold claim's ``Prefetch``."""

    run: Run
    abandoned: bool
    due_since: float
    prefetched: Prefetch | None = None


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
        Beside(_MESSAGES, message_rows(run_id, messages, ts, tokens), "msg_seq"),
        Beside(
            _EVENTS,
            [{"run_id": run_id, "type": t, "data": d, "created_at": ts} for t, d in events],
            "event_seq",
        ),
        Beside(_USAGE, usage_rows(run_id, ts, usage)),
        Beside(tool_calls, [dict(c) for c in calls]),
    ]


_MESSAGES, _EVENTS, _USAGE = messages, events, usage
_Shape = tuple[tuple[str, ...], bool, tuple[tuple[str, bool], ...]]  # values, owner, guard


# --- the statements, built once per shape ------------------------------------------------------


def claim_due() -> tuple[Any, ...]:
    """The WHERE of a round claim, with bind parameters. The status test is a disjunction
    of equalities, not ``IN``: a list ``IN`` is an expanding parameter, whose statement text
    SQLAlchemy renders again on every execute."""
    return (
        _R.id == sa.bindparam("b_run"),
        _R.version == sa.bindparam("b_version"),
        sa.or_(*(_R.status == value for value in sorted(s.value for s in RUNNABLE))),
        _R.open_calls == 0,
        _R.held == sa.false(),
        sa.or_(_R.wake_at.is_(None), _R.wake_at <= sa.bindparam("b_ts")),
        sa.not_(runs.live(_R.lease_owner, sa.bindparam("b_live_after"))),
    )


def claim_values() -> dict[str, Any]:
    return {
        "status": Status.RUNNING.value,
        "lease_owner": sa.bindparam("b_owner"),
        "wake_at": None,
        "redrives": 0,
        "attempts": _R.attempts + 1,  # L-12: every claim counts; the round's commit resets
        "updated_at": sa.bindparam("b_ts"),
        "event_seq": _R.event_seq + 1,
    }


@lru_cache(maxsize=256)
def update_statement(
    kinds: tuple[tuple[str, str], ...], owner: bool, guard: tuple[tuple[str, bool], ...]
) -> Any:
    """The guarded UPDATE … RETURNING for this shape: each value a bind parameter (``null``:
    SQL NULL, ``inc``: the column plus it); ``guard``: (column, is None) pairs."""
    sets: dict[str, Any] = {}
    for name, kind in kinds:
        param = sa.bindparam(f"v_{name}", type_=_R[name].type)
        sets[name] = {"null": sa.null(), "inc": _R[name] + param}.get(kind, param)
    where = [_R.id == sa.bindparam("b_run"), _R.version == sa.bindparam("b_version")]
    if owner:
        where.append(_R.lease_owner == sa.bindparam("b_owner"))
    for g, is_none in guard:
        where.append(_R[g].is_(None) if is_none else _R[g] == sa.bindparam(f"g_{g}"))
    return sa.update(runs_table).where(*where).values(**sets).returning(runs_table)


def kind_of(value: Any) -> str:
    return "inc" if isinstance(value, Inc) else "null" if value is None else "value"


def _statement_of(vals: Mapping[str, Any], owner: bool, guard: Mapping[str, Any]) -> Any:
    kinds = tuple((name, kind_of(v)) for name, v in vals.items())
    return update_statement(kinds, owner, tuple((g, v is None) for g, v in guard.items()))


class Store:
    """The writes whose SQL differs by dialect; this class: any dialect (SQLite), with plain
    statements. ``PostgresStore`` overrides the hooks that PostgreSQL does in one statement."""

    dialect = "sqlite"

    # -- claim ------------------------------------------------------------------------------

    def claim_round(
        self,
        conn: Connection,
        run_id: str,
        version: int,
        owner: str,
        ts: float,
        live_after: float,
        *,
        cold: bool = False,
    ) -> Claimed | None:
        """Take the round: the run is at ``version``, runnable, no tools open, not held,
        due, and no live worker holds it. The same transaction writes its ``round.started``
        event at the seq the UPDATE takes (``round_started``: its data). ``cold``: this
        process holds nothing of the run (read its spec and messages with it, where the
        dialect can)."""
        params = claim_params(run_id, version, owner, ts, live_after)
        return self._claim(conn, params, ts, cold)

    def _claim(self, conn: Connection, params: Any, ts: float, cold: bool) -> Claimed | None:
        """``claim_round``'s statements (``params``: ``claim_params``): any dialect, a
        conditional UPDATE then the event's INSERT; no prefetch."""
        was = conn.execute(_was(), params).first()
        if was is None:
            return None
        run = Run.of(conn.execute(_take(), params).mappings().one())
        insert_events(conn, run.id, run.event_seq, [(ROUND_STARTED, round_started(run))], ts)
        return Claimed(run, was[0] is not None, max(was[1], was[2] or 0.0))

    def claim_call(
        self, conn: Connection, run: Run, call: Call, owner: str, ts: float, live_after: float
    ) -> tuple[Run, Call] | None:
        """Take ``call`` of ``run`` (both as read): the call is queued, or running under a
        worker that is gone (its attempt counted, ``owner`` its lease), and the run is still
        at its version (an event seq taken, not bumped). The same transaction writes the
        ``tool.started`` event (``tool_started``). Returns the run and the call as they now
        are; None: not taken — the caller rolls the transaction back."""
        took = calls.claim_call(conn, run.id, call.call_id, owner, ts, live_after)
        if took is None:
            return None
        new = self.update_run(conn, run.id, run.version, {}, bump=False, new_events=1, ts=ts)
        if new is None:
            return None
        insert_events(conn, run.id, new.event_seq, [(TOOL_STARTED, tool_started(took))], ts)
        return new, took

    # -- the guarded write ------------------------------------------------------------------

    def update_run(
        self,
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
        """The guarded UPDATE of a transition: applies if the run is still at ``version``
        (and ``owner`` still holds its round, and each ``guard`` column still has its
        value); None = lost the race. Allocates ``new_messages`` message seqs and
        ``new_events`` event seqs (the returned row's last ones). A value may be
        ``Inc(n)``: the column plus n. ``beside``: rows inserted with it when it applies;
        ``closing``: values set on the run's calls."""
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
        beside = [b for b in beside if b.rows]
        closing = [c for c in closing if c.call_ids]
        return self._write(conn, Write(vals, owner is not None, guard, params, beside, closing))

    def _write(self, conn: Connection, w: Write) -> Run | None:
        """The UPDATE, then the calls' values and the rows beside it (this transaction rolls
        back what it did if the UPDATE lost: the caller raises)."""
        for c in w.closing:
            n = calls.set_calls(
                conn,
                str(w.params["b_run"]),
                c.call_ids,
                c.values,
                from_status=c.from_status,
                attempts=c.attempts,
            )
            if c.guarded and n != len(c.call_ids):
                return None  # a call moved on: the transition is lost
        stmt = _statement_of(w.vals, w.owner, w.guard)
        row = conn.execute(stmt, w.params).mappings().first()
        if row is None:
            return None
        new = Run.of(row)
        for b in w.beside:
            _insert_beside(conn, new, b)
        return new

    # -- inserts and reads ------------------------------------------------------------------

    def insert_run(
        self,
        conn: Connection,
        row: dict[str, Any],
        spec: dict[str, Any],
        msgs: Sequence[Message],
        ts: float,
        *,
        if_absent: bool = False,
    ) -> bool:
        """Insert a run, what it was given and its first messages. ``if_absent``: ``INSERT
        ... ON CONFLICT (id) DO NOTHING`` (a run id derived from its cause, e.g. a child
        run's); False = it existed. A run with a base (``row["base_seq"]``,
        ``shared.store.lineage``) numbers its messages after the base's; ``row["view_tokens"]``
        then counts the base's part of the model view."""
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
            stmt = self.insert_ignoring(runs_table, [runs_table.c.id]).values(**values)
            if conn.execute(stmt.returning(runs_table.c.id)).first() is None:
                return False
        else:
            conn.execute(sa.insert(runs_table).values(**values))
        conn.execute(sa.insert(run_specs).values(run_id=row["id"], **spec))
        start = int(row.get("round") or 0)  # a fork starts at its source's round
        insert_messages(conn, row["id"], first, [(m, start) for m in msgs], ts)
        return True

    def insert_ignoring(self, table: sa.Table, index: Sequence[Any]) -> Any:
        """``INSERT … ON CONFLICT (index) DO NOTHING`` into ``table`` (values to add)."""
        return sqlite.insert(table).on_conflict_do_nothing(index_elements=list(index))

    def run_and_round(
        self, conn: Connection, run_id: str, tenant: str | None, call_id: str
    ) -> tuple[RunRecord, list[Call]] | None:
        """The run as the API shows it and the calls of the round ``call_id`` belongs to
        (what an answer reads)."""
        record = runs.get_run(conn, run_id, tenant)
        if record is None:
            return None
        return record, calls.round_of_call(conn, run_id, call_id)


# --- helpers and PostgreSQL's statements ---------------------------------------------------


def claim_params(run_id: str, version: int, owner: str, ts: float, live_after: float) -> Any:
    return {
        "b_run": run_id,
        "b_version": version,
        "b_owner": owner,
        "b_ts": ts,
        "b_live_after": live_after,
    }


@lru_cache(maxsize=1)
def _was() -> Any:
    return sa.select(_R.lease_owner, _R.updated_at, _R.wake_at).where(*claim_due())


@lru_cache(maxsize=1)
def _take() -> Any:
    stmt = sa.update(runs_table).where(_R.id == sa.bindparam("b_run")).values(**claim_values())
    return stmt.returning(runs_table)


def _insert_beside(conn: Connection, run: Run, b: Beside) -> None:
    """The rows beside an UPDATE in their own INSERT (SQLite; a value JSON cannot carry)."""
    rows = b.rows
    if b.seq is not None:
        last = int(getattr(run, b.seq))
        first = last - len(rows) + 1
        rows = [{**r, "seq": first + i} for i, r in enumerate(rows)]
    conn.execute(sa.insert(b.table), rows)
