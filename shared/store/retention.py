"""The SQL of deleting: a run and every row of it (and of its sub-agent runs), a thread with its
runs, a dataset with its documents and chunks, and the choice of what retention purges.

A run's rows: ``runs``, ``run_specs``, ``messages``, ``tool_calls``, ``usage``, ``events``,
``outbox``, ``resume_tokens``, ``facade_segments``, ``webhook_deliveries`` (and their
``webhook_attempts``); a cron's fire log keeps the slot but forgets the run. A run whose
messages another run reads as its history (``base_run_id``: a thread's next run, a fork) is
kept while that run exists (``referenced``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from shared.store.rows import FINAL
from shared.store.tables import (
    cron_fires,
    crons,
    dataset_chunks,
    dataset_documents,
    datasets,
    events,
    facade_segments,
    messages,
    outbox,
    resume_tokens,
    run_specs,
    runs,
    threads,
    tool_calls,
    usage,
    webhook_attempts,
    webhook_deliveries,
)

__all__ = [
    "RUN_TABLES",
    "delete_dataset",
    "delete_runs",
    "delete_thread",
    "expired_runs",
    "not_final",
    "referenced",
    "run_tree",
    "thread_run_ids",
]

RUN_TABLES = (
    run_specs,
    messages,
    tool_calls,
    usage,
    events,
    outbox,
    resume_tokens,
    facade_segments,
)
"""The tables whose ``run_id`` column names the run a row belongs to (webhook deliveries are
deleted with their attempts, separately)."""
_FINAL = [s.value for s in FINAL]
_CHUNK = 500  # ids per IN (...) list


def _chunks(ids: Sequence[str]) -> list[list[str]]:
    return [list(ids[i : i + _CHUNK]) for i in range(0, len(ids), _CHUNK)]


def run_tree(conn: Connection, run_ids: Sequence[str]) -> list[str]:
    """The runs and all their sub-agent runs, at any depth."""
    out: list[str] = list(dict.fromkeys(run_ids))
    level = list(out)
    while level:
        q = sa.select(runs.c.id).where(runs.c.parent_run_id.in_(level))
        level = [str(i) for i in conn.execute(q).scalars() if i not in out]
        out += level
    return out


def _run_ids_where(
    conn: Connection,
    run_ids: Sequence[str],
    where: Callable[[list[str]], sa.ColumnElement[bool]],
) -> list[str]:
    """The ids of the runs that match ``where(part)``, for each chunk of ``run_ids``."""
    out: list[str] = []
    for part in _chunks(run_ids):
        q = sa.select(runs.c.id).where(where(part))
        out += [str(i) for i in conn.execute(q).scalars()]
    return out


def not_final(conn: Connection, run_ids: Sequence[str]) -> list[str]:
    """Those of the runs that have not ended."""
    return _run_ids_where(
        conn, run_ids, lambda part: runs.c.id.in_(part) & runs.c.status.not_in(_FINAL)
    )


def referenced(conn: Connection, run_ids: Sequence[str]) -> list[str]:
    """Runs outside ``run_ids`` that read one of them as their history (their base)."""
    return _run_ids_where(
        conn, run_ids, lambda part: runs.c.base_run_id.in_(part) & runs.c.id.not_in(run_ids)
    )


def delete_runs(conn: Connection, run_ids: Sequence[str]) -> int:
    """Delete the runs and every row of them; returns how many runs went."""
    gone = 0
    for part in _chunks(run_ids):
        hooks = sa.select(webhook_deliveries.c.id).where(webhook_deliveries.c.run_id.in_(part))
        conn.execute(sa.delete(webhook_attempts).where(webhook_attempts.c.delivery_id.in_(hooks)))
        conn.execute(sa.delete(webhook_deliveries).where(webhook_deliveries.c.run_id.in_(part)))
        for table in RUN_TABLES:
            conn.execute(sa.delete(table).where(table.c.run_id.in_(part)))
        conn.execute(sa.update(cron_fires).where(cron_fires.c.run_id.in_(part)).values(run_id=None))
        conn.execute(sa.update(crons).where(crons.c.last_run_id.in_(part)).values(last_run_id=None))
        gone += int(conn.execute(sa.delete(runs).where(runs.c.id.in_(part))).rowcount)
    return gone


def thread_run_ids(conn: Connection, thread_id: str) -> list[str]:
    q = sa.select(runs.c.id).where(runs.c.thread_id == thread_id)
    return [str(i) for i in conn.execute(q).scalars()]


def delete_thread(conn: Connection, thread_id: str) -> None:
    """The thread row and its facade segments (its runs: ``delete_runs`` first)."""
    conn.execute(sa.delete(facade_segments).where(facade_segments.c.thread_id == thread_id))
    conn.execute(sa.delete(crons).where(crons.c.thread_id == thread_id))
    conn.execute(sa.delete(threads).where(threads.c.id == thread_id))


def delete_dataset(conn: Connection, dataset_id: str, tenant: str) -> bool:
    """A dataset, its documents and chunks (their full-text index follows); False: the
    tenant has no such dataset."""
    found = conn.execute(
        sa.select(datasets.c.id).where(datasets.c.id == dataset_id, datasets.c.tenant == tenant)
    ).first()
    if found is None:
        return False
    conn.execute(sa.delete(dataset_chunks).where(dataset_chunks.c.dataset_id == dataset_id))
    conn.execute(sa.delete(dataset_documents).where(dataset_documents.c.dataset_id == dataset_id))
    conn.execute(sa.delete(datasets).where(datasets.c.id == dataset_id))
    return True


def expired_runs(
    conn: Connection,
    ts: float,
    older_than: float | None,
    limit: int | None,
    *,
    tenant: str | None = None,
) -> list[str]:
    """Top-level ended runs due for purging: ended before ``older_than`` (retention), or past
    their own ``ttl_s``; none that another run reads as history. Oldest first."""
    r = runs.c
    due = sa.and_(r.ttl_s.is_not(None), r.updated_at + r.ttl_s < ts)
    if older_than is not None:
        due = sa.or_(due, r.updated_at < older_than)
    other = runs.alias("other")
    based = sa.exists().where(other.c.base_run_id == r.id)
    q = sa.select(r.id).where(r.status.in_(_FINAL), r.parent_run_id.is_(None), due, ~based)
    if tenant is not None:
        q = q.where(r.tenant == tenant)
    q = q.order_by(r.updated_at)
    if limit is not None:
        q = q.limit(limit)
    return [str(i) for i in conn.execute(q).scalars()]
