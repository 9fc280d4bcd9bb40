"""Repository functions. Every state change of a run goes through ``apply``: one guarded
UPDATE of the ``runs`` row (``WHERE version = V``) that also allocates message and event
sequence numbers, then the inserts that go with it — all inside the caller's transaction.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, RowMapping

from shared.agent.messages import Message
from shared.store.deliveries import record_webhooks
from shared.store.tables import events, messages, outbox, runs, tool_calls, usage

__all__ = [
    "Changes",
    "apply",
    "bump_event_seq",
    "claim_round",
    "claim_tool",
    "delete_outbox",
    "due_outbox",
    "find_idempotent",
    "get_run",
    "insert_event",
    "insert_run",
    "list_events",
    "list_messages",
    "list_runs",
    "list_tool_calls",
    "message_from_row",
    "now",
    "postpone_outbox",
    "release_round",
    "renew_round",
    "renew_tool",
]


def now() -> float:
    return time.time()


@dataclass
class Changes:
    """What one transaction does to one run (besides tool-call rows)."""

    values: dict[str, Any] = field(default_factory=dict)
    messages: list[tuple[Message, int]] = field(default_factory=list)  # (message, round)
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    outbox: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (kind, payload)
    usage: list[dict[str, Any]] = field(default_factory=list)
    bump_version: bool = True

    def event(self, type_: str, **data: Any) -> None:
        self.events.append((type_, data))

    def message(self, msg: Message, round_: int) -> None:
        self.messages.append((msg, round_))


@dataclass(frozen=True)
class Applied:
    version: int
    outbox_ids: list[tuple[int, str, dict[str, Any]]]  # (id, kind, payload)
    row: RowMapping
    events: int = 0  # durable events written (SSE tails are woken after the commit)


def insert_run(
    conn: Connection,
    row: dict[str, Any],
    msgs: Sequence[Message],
    ts: float,
    *,
    if_absent: bool = False,
) -> bool:
    """Insert a run and its first messages. ``if_absent``: ``INSERT ... ON CONFLICT (id) DO
    NOTHING`` (a run id derived from its cause, e.g. a child run's); False = it existed."""
    values = {**row, "msg_seq": len(msgs), "created_at": ts, "updated_at": ts}
    if if_absent:
        if not conn.execute(_insert_if_absent(conn, values)).first():
            return False
    else:
        conn.execute(sa.insert(runs).values(**values))
    _insert_messages(conn, row["id"], 1, [(m, 0) for m in msgs], ts)
    return True


def _insert_if_absent(conn: Connection, values: dict[str, Any]) -> Any:
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return (
            pg_insert(runs)
            .values(**values)
            .on_conflict_do_nothing(index_elements=[runs.c.id])
            .returning(runs.c.id)
        )
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return (
        sqlite_insert(runs)
        .values(**values)
        .on_conflict_do_nothing(index_elements=[runs.c.id])
        .returning(runs.c.id)
    )


def find_idempotent(conn: Connection, tenant: str, key: str) -> RowMapping | None:
    q = sa.select(runs).where(runs.c.tenant == tenant, runs.c.idempotency_key == key)
    return conn.execute(q).mappings().first()


def get_run(conn: Connection, run_id: str, tenant: str | None = None) -> RowMapping | None:
    q = sa.select(runs).where(runs.c.id == run_id)
    if tenant is not None:
        q = q.where(runs.c.tenant == tenant)
    return conn.execute(q).mappings().first()


def list_runs(
    conn: Connection,
    tenant: str,
    *,
    status: str | None = None,
    thread_id: str | None = None,
    limit: int = 50,
    before: tuple[float, str] | None = None,
) -> list[RowMapping]:
    q = sa.select(runs).where(runs.c.tenant == tenant)
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
    return list(conn.execute(q).mappings())


def list_messages(conn: Connection, run_id: str, from_seq: int = 0) -> list[RowMapping]:
    q = (
        sa.select(messages)
        .where(messages.c.run_id == run_id, messages.c.seq >= from_seq)
        .order_by(messages.c.seq)
    )
    return list(conn.execute(q).mappings())


def message_from_row(row: RowMapping) -> Message:
    return Message.from_dict(
        {
            "role": row["role"],
            "content": row["content"],
            "reasoning": row["reasoning"],
            "tool_calls": row["tool_calls"] or (),
            "tool_call_id": row["tool_call_id"],
            "name": row["name"],
            "hidden": row["hidden"],
            "kind": row["kind"],
        }
    )


def list_events(
    conn: Connection, run_id: str, after: int = 0, limit: int = 1000
) -> list[RowMapping]:
    q = (
        sa.select(events)
        .where(events.c.run_id == run_id, events.c.seq > after)
        .order_by(events.c.seq)
        .limit(limit)
    )
    return list(conn.execute(q).mappings())


def list_tool_calls(conn: Connection, run_id: str, round_: int | None = None) -> list[RowMapping]:
    q = sa.select(tool_calls).where(tool_calls.c.run_id == run_id)
    if round_ is not None:
        q = q.where(tool_calls.c.round == round_)
    return list(conn.execute(q.order_by(tool_calls.c.round, tool_calls.c.idx)).mappings())


def _insert_messages(
    conn: Connection, run_id: str, first_seq: int, msgs: Sequence[tuple[Message, int]], ts: float
) -> None:
    if not msgs:
        return
    rows = []
    for i, (m, round_) in enumerate(msgs):
        d = m.to_dict()
        rows.append(
            {
                "run_id": run_id,
                "seq": first_seq + i,
                "round": round_,
                "role": d["role"],
                "content": d["content"],
                "reasoning": d["reasoning"] or None,
                "tool_calls": d["tool_calls"] or None,
                "tool_call_id": d["tool_call_id"],
                "name": d["name"],
                "hidden": d["hidden"],
                "kind": d["kind"],
                "created_at": ts,
            }
        )
    conn.execute(sa.insert(messages), rows)


def _insert_events(
    conn: Connection,
    run: RowMapping,
    first_seq: int,
    evs: Sequence[tuple[str, dict[str, Any]]],
    ts: float,
    redrive_after: float,
) -> list[tuple[int, str, dict[str, Any]]]:
    """The event rows, and the webhook deliveries they fire (outbox items to publish)."""
    if not evs:
        return []
    numbered = [(first_seq + i, t, d) for i, (t, d) in enumerate(evs)]
    conn.execute(
        sa.insert(events),
        [
            {"run_id": run["id"], "seq": seq, "type": t, "data": d, "created_at": ts}
            for seq, t, d in numbered
        ],
    )
    return record_webhooks(conn, run, numbered, ts, redrive_after) if run["webhook"] else []


def insert_event(
    conn: Connection,
    run: RowMapping,
    type_: str,
    data: dict[str, Any],
    ts: float,
    redrive_after: float,
) -> list[tuple[int, str, dict[str, Any]]]:
    """One event at ``run["event_seq"]``, a seq the caller's UPDATE of ``runs`` already took
    (``claim_round``, ``bump_event_seq``). Returns webhook outbox items to publish."""
    return _insert_events(conn, run, run["event_seq"], [(type_, data)], ts, redrive_after)


def bump_event_seq(conn: Connection, run_id: str, version: int) -> RowMapping | None:
    """Take the next event seq of a run still at ``version`` (row lock until commit, so seqs
    commit in order); None = the run moved on."""
    stmt = (
        sa.update(runs)
        .where(runs.c.id == run_id, runs.c.version == version)
        .values(event_seq=runs.c.event_seq + 1)
        .returning(*runs.c)
    )
    return conn.execute(stmt).mappings().first()


def apply(
    conn: Connection,
    run_id: str,
    version: int,
    changes: Changes,
    *,
    redrive_after: float,
    ts: float | None = None,
) -> Applied | None:
    """Apply ``changes`` if the run is still at ``version``; None = lost the race."""
    ts = now() if ts is None else ts
    values = dict(changes.values)
    values["updated_at"] = ts
    if changes.messages:
        values["msg_seq"] = runs.c.msg_seq + len(changes.messages)
    if changes.events:
        values["event_seq"] = runs.c.event_seq + len(changes.events)
    if changes.bump_version:
        values["version"] = runs.c.version + 1
    stmt = (
        sa.update(runs)
        .where(runs.c.id == run_id, runs.c.version == version)
        .values(**values)
        .returning(*runs.c)
    )
    row = conn.execute(stmt).mappings().first()
    if row is None:
        return None
    _insert_messages(conn, run_id, row["msg_seq"] - len(changes.messages) + 1, changes.messages, ts)
    hooks = _insert_events(
        conn, row, row["event_seq"] - len(changes.events) + 1, changes.events, ts, redrive_after
    )
    if changes.usage:
        conn.execute(
            sa.insert(usage), [{"run_id": run_id, "created_at": ts, **u} for u in changes.usage]
        )
    ids = _insert_outbox(conn, run_id, row["version"], changes.outbox, ts + redrive_after, ts)
    return Applied(
        version=row["version"], outbox_ids=ids + hooks, row=row, events=len(changes.events)
    )


def _insert_outbox(
    conn: Connection,
    run_id: str,
    version: int,
    items: Iterable[tuple[str, dict[str, Any]]],
    available_at: float,
    ts: float,
) -> list[tuple[int, str, dict[str, Any]]]:
    out = []
    for kind, payload in items:
        body = {"run_id": run_id, "version": version, **payload}
        stmt = (
            sa.insert(outbox)
            .values(
                run_id=run_id, kind=kind, payload=body, available_at=available_at, created_at=ts
            )
            .returning(outbox.c.id)
        )
        out.append((int(conn.execute(stmt).scalar_one()), kind, body))
    return out


def delete_outbox(conn: Connection, outbox_id: int | None) -> None:
    if outbox_id is not None:
        conn.execute(sa.delete(outbox).where(outbox.c.id == outbox_id))


def due_outbox(conn: Connection, ts: float, limit: int = 500) -> list[RowMapping]:
    q = sa.select(outbox).where(outbox.c.available_at <= ts).order_by(outbox.c.id).limit(limit)
    return list(conn.execute(q).mappings())


def postpone_outbox(conn: Connection, ids: Sequence[int], until: float) -> None:
    if ids:
        conn.execute(sa.update(outbox).where(outbox.c.id.in_(ids)).values(available_at=until))


def claim_round(
    conn: Connection, run_id: str, version: int, owner: str, lease: float, ts: float
) -> RowMapping | None:
    """Take the round: the run is at ``version``, runnable, no tools open, no live lease.
    The same UPDATE takes an event seq for ``round.started`` (see ``insert_event``)."""
    stmt = (
        sa.update(runs)
        .where(
            runs.c.id == run_id,
            runs.c.version == version,
            runs.c.status.in_(("queued", "running")),
            runs.c.open_calls == 0,
            runs.c.held == sa.false(),  # held behind its thread's active run: never starts
            sa.or_(runs.c.lease_until.is_(None), runs.c.lease_until < ts),
        )
        .values(
            status="running",
            lease_owner=owner,
            lease_until=ts + lease,
            updated_at=ts,
            event_seq=runs.c.event_seq + 1,
        )
        .returning(*runs.c)
    )
    return conn.execute(stmt).mappings().first()


def renew_round(conn: Connection, run_id: str, version: int, owner: str, until: float) -> bool:
    stmt = (
        sa.update(runs)
        .where(runs.c.id == run_id, runs.c.version == version, runs.c.lease_owner == owner)
        .values(lease_until=until)
    )
    return conn.execute(stmt).rowcount == 1


def release_round(conn: Connection, run_id: str, version: int, owner: str) -> None:
    stmt = (
        sa.update(runs)
        .where(runs.c.id == run_id, runs.c.version == version, runs.c.lease_owner == owner)
        .values(lease_until=None, lease_owner=None)
    )
    conn.execute(stmt)


def claim_tool(
    conn: Connection, run_id: str, call_id: str, lease: float, ts: float
) -> RowMapping | None:
    """Take a tool call that is queued, or running under an expired lease."""
    stmt = (
        sa.update(tool_calls)
        .where(
            tool_calls.c.run_id == run_id,
            tool_calls.c.call_id == call_id,
            sa.or_(
                tool_calls.c.status == "queued",
                sa.and_(tool_calls.c.status == "running", tool_calls.c.lease_until < ts),
            ),
        )
        .values(
            status="running",
            attempts=tool_calls.c.attempts + 1,
            lease_until=ts + lease,
            started_at=sa.func.coalesce(tool_calls.c.started_at, ts),
        )
        .returning(*tool_calls.c)
    )
    return conn.execute(stmt).mappings().first()


def renew_tool(conn: Connection, run_id: str, call_id: str, attempt: int, until: float) -> bool:
    stmt = (
        sa.update(tool_calls)
        .where(
            tool_calls.c.run_id == run_id,
            tool_calls.c.call_id == call_id,
            tool_calls.c.attempts == attempt,
            tool_calls.c.status == "running",
        )
        .values(lease_until=until)
    )
    return conn.execute(stmt).rowcount == 1
