"""Deleting what is no longer wanted: a run (ended) with every row of it and of its sub-agent
runs, a thread with its runs, a dataset; and retention, which the reaper runs each pass.

**Retention**: top-level runs that ended more than ``TREADLE_RETENTION_DAYS`` ago, or whose own
``ttl_s`` has passed since they ended, are deleted in batches of ``BATCH`` runs, one short
transaction each (at most ``MAX_BATCHES`` a pass), oldest first. A run another run reads as
its history (a thread's next run, a fork) stays until that run goes; sub-agent runs go with
their parent. The SQL is ``shared.store.retention``'s. The same pass deletes the rows of
long-term memory items whose TTL has passed (``shared.engine.memory.purge``; reads stopped
seeing them when they expired).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlalchemy.engine import Connection

from shared.engine import memory
from shared.engine.runtime import Runtime
from shared.errors import Conflict, NotFound
from shared.store import retention as store
from shared.store import runs as run_store
from shared.store import threads as thread_store
from shared.store.db import reading

__all__ = [
    "BATCH",
    "MAX_BATCHES",
    "PurgeReport",
    "delete_dataset",
    "delete_run",
    "delete_thread",
    "purge",
    "reap_pass",
]

log = logging.getLogger("treadle.retention")
BATCH = 50
MAX_BATCHES = 20
DAY = 86_400.0
EVERY_S = 60.0  # the reaper purges at most this often (its pass runs every few seconds)


def reap_pass(rt: Runtime) -> PurgeReport | None:
    """The reaper's call: ``purge`` at most once per ``EVERY_S`` in this process."""
    ts = run_store.now()
    if not rt.pacer.due("retention", EVERY_S, ts):
        return None
    return purge(rt, now=ts)


def delete_run(rt: Runtime, tenant: str, run_id: str) -> int:
    """Delete an ended run and its sub-agent runs, every row of them; returns the runs
    deleted. NotFound (another tenant's run too); Conflict: not ended, a sub-agent run (it
    goes with its parent), or another run's history."""
    with rt.engine.begin() as conn:
        run = run_store.lock_run(conn, run_id)
        if run is None or run.tenant != tenant:
            raise NotFound(f"run {run_id} not found")
        if not run.final:
            raise Conflict(f"run {run_id} is {run.status}: cancel it first")
        if run.parent_run_id is not None:
            raise Conflict(f"run {run_id} is a sub-agent run of {run.parent_run_id}: delete that")
        return _delete(conn, [run_id], f"run {run_id}")


def delete_thread(rt: Runtime, tenant: str, thread_id: str) -> int:
    """Delete a thread and all its runs (every one ended: else Conflict)."""
    with rt.engine.begin() as conn:
        if thread_store.lock_thread(conn, thread_id, run_store.now(), tenant) is None:
            raise NotFound(f"thread {thread_id} not found")
        n = _delete(conn, store.thread_run_ids(conn, thread_id), f"thread {thread_id}")
        store.delete_thread(conn, thread_id)
        return n


def _delete(conn: Connection, run_ids: list[str], what: str) -> int:
    tree = store.run_tree(conn, run_ids)
    busy = store.not_final(conn, tree)
    if busy:
        raise Conflict(f"{what}: run {busy[0]} has not ended; cancel it first")
    readers = store.referenced(conn, tree)
    if readers:
        raise Conflict(f"{what}: run {readers[0]} reads it as its history; delete that first")
    return store.delete_runs(conn, tree)


def delete_dataset(rt: Runtime, tenant: str, dataset_id: str) -> None:
    with rt.engine.begin() as conn:
        if not store.delete_dataset(conn, dataset_id, tenant):
            raise NotFound(f"dataset {dataset_id} not found")


@dataclass(frozen=True)
class PurgeReport:
    runs: int  # top-level runs chosen
    deleted: int  # runs deleted, sub-agent runs included (0 on a dry run)
    memory_items: int = 0  # expired memory items deleted


def purge(
    rt: Runtime,
    *,
    older_than_s: float | None = None,
    now: float | None = None,
    dry_run: bool = False,
    max_batches: int = MAX_BATCHES,
) -> PurgeReport:
    """Delete ended runs past retention (``older_than_s``, default the setting) or their own
    ``ttl_s``, ``BATCH`` runs per transaction, and expired memory items. ``dry_run``: count
    the runs it would delete now (a run kept as another's history is not counted)."""
    ts = run_store.now() if now is None else now
    days = rt.settings.retention_days
    age = older_than_s if older_than_s is not None else (days * DAY if days > 0 else None)
    cutoff = ts - age if age is not None else None
    if dry_run:
        with reading(rt.engine) as conn:
            return PurgeReport(len(store.expired_runs(conn, ts, cutoff, None)), 0)
    chosen = deleted = 0
    kept: set[str] = set()  # runs with a sub-agent run still going (rare): not this pass
    for _ in range(max_batches):
        with rt.engine.begin() as conn:
            found = store.expired_runs(conn, ts, cutoff, BATCH + len(kept))
            ids = [i for i in found if i not in kept][:BATCH]
            if not ids:
                break
            trees = {i: store.run_tree(conn, [i]) for i in ids}
            busy = set(store.not_final(conn, [r for t in trees.values() for r in t]))
            kept.update(i for i, t in trees.items() if busy.intersection(t))
            tree = [r for i, t in trees.items() if i not in kept for r in t]
            chosen += len(ids)
            deleted += store.delete_runs(conn, tree)
    if deleted:
        log.info("retention: deleted %d runs", deleted)
    items = memory.purge(rt, now=ts, batches=max_batches)
    if items:
        log.info("retention: deleted %d expired memory items", items)
    return PurgeReport(chosen, deleted, items)
