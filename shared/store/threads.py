"""Repository functions for threads: a conversation whose runs take its earlier messages as
history. The policy (one active run, multitask) is in ``shared.engine.threads``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, RowMapping

from shared.store.rows import ACTIVE as ACTIVE_STATUSES
from shared.store.rows import Run
from shared.store.runs import meta_match
from shared.store.tables import messages, runs, threads
from shared.vocab import Status

__all__ = [
    "ACTIVE",
    "active_run",
    "get_thread",
    "insert_thread",
    "last_result",
    "last_started",
    "lock_thread",
    "next_held",
    "search_threads",
    "stalled_threads",
    "thread_messages",
    "thread_runs",
]

_TICK = 1e-6
ACTIVE = tuple(s.value for s in ACTIVE_STATUSES)
"""Non-final statuses. A held run is queued too, but it is not the thread's active run."""


def insert_thread(conn: Connection, row: dict[str, Any], ts: float) -> RowMapping:
    stmt = sa.insert(threads).values(**row, created_at=ts, updated_at=ts).returning(*threads.c)
    return conn.execute(stmt).mappings().one()


def get_thread(conn: Connection, thread_id: str, tenant: str | None = None) -> RowMapping | None:
    q = sa.select(threads).where(threads.c.id == thread_id)
    if tenant is not None:
        q = q.where(threads.c.tenant == tenant)
    return conn.execute(q).mappings().first()


def lock_thread(
    conn: Connection, thread_id: str, ts: float, tenant: str | None = None
) -> RowMapping | None:
    """Take the thread's row lock for the rest of the transaction (and touch ``updated_at``).

    Every transaction that submits a run to a thread or ends a run on one takes this lock
    first, before any run row: "is the thread busy?" and "the active run ended" are then
    serialized, and the lock order (thread, then runs) cannot deadlock. The returned
    ``updated_at`` grows strictly with each lock, so it orders the thread's runs as admitted.
    """
    stmt = sa.update(threads).where(threads.c.id == thread_id)
    if tenant is not None:
        stmt = stmt.where(threads.c.tenant == tenant)
    stamp = sa.case((threads.c.updated_at >= ts, threads.c.updated_at + _TICK), else_=ts)
    stmt = stmt.values(updated_at=stamp).returning(*threads.c)
    return conn.execute(stmt).mappings().first()


def active_run(conn: Connection, thread_id: str) -> Run | None:
    """The thread's running run: non-final and not held (there is at most one)."""
    q = (
        sa.select(runs)
        .where(runs.c.thread_id == thread_id, runs.c.status.in_(ACTIVE), runs.c.held == sa.false())
        .order_by(runs.c.created_at, runs.c.id)
        .limit(1)
    )
    row = conn.execute(q).mappings().first()
    return Run.of(row) if row is not None else None


def next_held(conn: Connection, thread_id: str) -> Run | None:
    """The oldest run waiting for the thread (multitask enqueue), if any."""
    q = (
        sa.select(runs)
        .where(
            runs.c.thread_id == thread_id, runs.c.status == Status.QUEUED, runs.c.held == sa.true()
        )
        .order_by(runs.c.created_at, runs.c.id)
        .limit(1)
    )
    row = conn.execute(q).mappings().first()
    return Run.of(row) if row is not None else None


def last_started(conn: Connection, thread_id: str, *, other_than: str) -> Run | None:
    """The thread's newest run that started (not held), other than ``other_than``: the run a
    new one continues (its messages are the new run's history, by reference)."""
    q = (
        sa.select(runs)
        .where(
            runs.c.thread_id == thread_id,
            runs.c.held == sa.false(),
            runs.c.id != other_than,
        )
        .order_by(runs.c.created_at.desc(), runs.c.id.desc())
        .limit(1)
    )
    row = conn.execute(q).mappings().first()
    return Run.of(row) if row is not None else None


def thread_runs(conn: Connection, thread_id: str) -> list[Run]:
    """The thread's runs, oldest first."""
    q = sa.select(runs).where(runs.c.thread_id == thread_id).order_by(runs.c.created_at, runs.c.id)
    return [Run.of(r) for r in conn.execute(q).mappings()]


def thread_messages(conn: Connection, thread_id: str, *, started_only: bool) -> list[RowMapping]:
    """Every run's own messages (not the history it copied), runs oldest first, then by seq.
    Rows carry ``run_id``. ``started_only`` leaves out runs cancelled while held."""
    q = (
        sa.select(messages)
        .join(runs, runs.c.id == messages.c.run_id)
        .where(
            runs.c.thread_id == thread_id,
            sa.or_(messages.c.kind.is_(None), messages.c.kind != "history"),
        )
        .order_by(runs.c.created_at, runs.c.id, messages.c.seq)
    )
    if started_only:
        q = q.where(runs.c.held == sa.false())
    return list(conn.execute(q).mappings())


def last_result(conn: Connection, thread_id: str, kind: str) -> dict[str, Any] | None:
    """The result of the thread's latest completed run of ``kind`` (SPEC H-1 context)."""
    q = (
        sa.select(runs.c.result)
        .where(
            runs.c.thread_id == thread_id,
            runs.c.kind == kind,
            runs.c.status == Status.COMPLETED,
            runs.c.result.is_not(None),
        )
        .order_by(runs.c.created_at.desc(), runs.c.id.desc())
        .limit(1)
    )
    result = conn.execute(q).scalar()
    return dict(result) if isinstance(result, dict) else None


def stalled_threads(conn: Connection, limit: int = 200) -> list[str]:
    """Threads with a held run and no active one (a safety net for the reaper)."""
    active = sa.alias(runs, "active")
    busy = sa.exists().where(
        active.c.thread_id == runs.c.thread_id,
        active.c.status.in_(ACTIVE),
        active.c.held == sa.false(),
    )
    q = (
        sa.select(runs.c.thread_id)
        .where(
            runs.c.held == sa.true(),
            runs.c.status == Status.QUEUED,
            runs.c.thread_id.is_not(None),  # a held run without a thread waits for admission
            ~busy,
        )
        .distinct()
        .limit(limit)
    )
    return [str(t) for t in conn.execute(q).scalars()]


def search_threads(
    conn: Connection,
    tenant: str,
    *,
    ids: list[str] | None = None,
    metadata: Mapping[str, str] | None = None,
    limit: int = 500,
) -> list[RowMapping]:
    """The tenant's threads, most recently updated first: those named (``ids``), whose
    metadata holds each key with that string value (``shared.store.runs.meta_match``)."""
    q = sa.select(threads).where(threads.c.tenant == tenant)
    if ids:
        q = q.where(threads.c.id.in_(ids))
    if metadata:
        q = q.where(meta_match(conn, threads.c.meta, metadata))
    q = q.order_by(threads.c.updated_at.desc()).limit(limit)
    return list(conn.execute(q).mappings())
