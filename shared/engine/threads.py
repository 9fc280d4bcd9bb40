"""Threads (DESIGN §7): runs on a thread take its earlier messages as history; a thread has
at most one active run; a run submitted to a busy thread follows the thread's ``multitask``
policy (reject | enqueue | interrupt — the interrupt itself is in ``commands``).

An enqueued run is created ``queued`` and ``held``: no outbox row, so nothing publishes it.
The transaction that ends the thread's active run releases the next held run (its history
copied then, so it sees the finished run's messages) — one transaction, no window.

Lock order: any transaction that submits to a thread or ends a run on one locks the thread
row first (``shared.store.threads.lock_thread``), then run and tool-call rows (ancestors'
runs rows before a child's: ``shared.engine.children``). Use ``apply_final`` instead of
``repo.apply`` for changes that may end or pause a run.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy.engine import Connection, RowMapping

from shared.agent.messages import Message
from shared.agent.thread import thread_history
from shared.engine import children
from shared.engine.runtime import OutboxItem, Runtime
from shared.errors import NotFound, SpecError
from shared.store import repo
from shared.store import threads as store

__all__ = [
    "FINAL",
    "HELPER_KINDS",
    "MULTITASK",
    "QUEUED_INPUT",
    "Admission",
    "apply_final",
    "create_thread",
    "history",
    "lock",
    "release_next",
    "release_stalled",
    "start_inputs",
]

log = logging.getLogger("treadle.threads")

FINAL = frozenset({"completed", "failed", "cancelled"})
MULTITASK = ("reject", "enqueue", "interrupt")
HELPER_KINDS = frozenset({"classify", "extract", "expand_query"})
QUEUED_INPUT = "queued_input"
"""``runs.inputs`` key holding a held run's input messages until it is released (its
history must come before them, and is only known then)."""


@dataclass(frozen=True)
class Admission:
    """How a new run joins its thread: held (enqueued) or started with this history."""

    held: bool = False
    stamp: float | None = None  # the run's created_at: admission order on the thread
    history: list[Message] = field(default_factory=list)
    inputs: dict[str, Any] = field(default_factory=dict)
    items: list[OutboxItem] = field(default_factory=list)  # queued by an interrupt


def create_thread(
    rt: Runtime, tenant: str, metadata: dict[str, Any] | None, multitask: str, thread_id: str
) -> RowMapping:
    if multitask not in MULTITASK:
        raise SpecError(f"multitask must be one of {', '.join(MULTITASK)}")
    row = {"id": thread_id, "tenant": tenant, "meta": metadata, "multitask": multitask}
    with rt.engine.begin() as conn:
        return store.insert_thread(conn, row, repo.now())


def lock(
    conn: Connection, thread_id: str | None, ts: float, tenant: str | None = None
) -> RowMapping | None:
    """Lock the thread row (no-op without a thread). NotFound for an unknown thread."""
    if thread_id is None:
        return None
    thread = store.lock_thread(conn, thread_id, ts, tenant)
    if thread is None:
        raise NotFound(f"thread {thread_id} not found")
    return thread


def history(conn: Connection, thread_id: str) -> list[Message]:
    """The thread's earlier turns as ``kind="history"`` copies (see ``thread_history``)."""
    per_run: dict[str, list[Message]] = {}
    for row in store.thread_messages(conn, thread_id, started_only=True):
        per_run.setdefault(row["run_id"], []).append(repo.message_from_row(row))
    return thread_history(list(per_run.values()))


def start_inputs(
    conn: Connection, thread_id: str, kind: str, inputs: Mapping[str, Any] | None
) -> dict[str, Any]:
    """A starting run's inputs; a helper kind gets the thread's previous result of its kind
    as ``last_result`` (SPEC H-1: the previous result on the same thread is given as context)."""
    out = {k: v for k, v in (inputs or {}).items() if k != QUEUED_INPUT}
    if kind in HELPER_KINDS:
        previous = store.last_result(conn, thread_id, kind)
        if previous is not None:
            out["last_result"] = previous
    return out


def release_next(
    conn: Connection, thread_id: str, *, redrive_after: float, ts: float, after: str | None = None
) -> list[OutboxItem]:
    """Start the thread's oldest held run if the thread has no active run; call it with the
    thread locked. Its history is copied now, then its queued input; its round is queued."""
    if store.active_run(conn, thread_id) is not None:
        return []
    nxt = store.next_held(conn, thread_id)
    if nxt is None:
        return []
    inputs = dict(nxt["inputs"] or {})
    queued = [Message.from_dict(m) for m in inputs.get(QUEUED_INPUT) or ()]
    changes = repo.Changes()
    for m in [*history(conn, thread_id), *queued]:
        changes.message(m, 0)
    changes.values.update(held=False,
                          inputs=start_inputs(conn, thread_id, nxt["kind"], inputs) or None)
    changes.event("run.released", after=after)
    changes.outbox.append(("round", {}))
    applied = repo.apply(conn, nxt["id"], nxt["version"], changes, redrive_after=redrive_after,
                         ts=ts)
    return applied.outbox_ids if applied is not None else []


def apply_final(
    conn: Connection,
    run_id: str,
    version: int,
    changes: repo.Changes,
    *,
    thread_id: str | None,
    redrive_after: float,
    ts: float | None = None,
) -> repo.Applied | None:
    """``repo.apply`` for changes that may end or pause a run. When they end a run on a
    thread: lock the thread first (lock order), and release the thread's next held run in the
    same transaction. When they end or pause a child run: lock its ancestors first, then tell
    its parent in the same transaction (``children.after_change``: the parent's join, or its
    surfaced pause). Outbox rows of those are added to the result's."""
    ts = repo.now() if ts is None else ts
    status = changes.values.get("status")
    ending = thread_id is not None and status in FINAL
    if ending:
        lock(conn, thread_id, ts)
    parent = (children.lock_lineage(conn, run_id, ts=ts, ending=status in FINAL)
              if children.propagates(status) else None)
    applied = repo.apply(conn, run_id, version, changes, redrive_after=redrive_after, ts=ts)
    if applied is None:
        return None
    items: list[OutboxItem] = []
    if parent is not None:
        items += children.after_change(conn, applied.row, redrive_after=redrive_after, ts=ts)
    if ending and thread_id is not None:
        items += release_next(conn, thread_id, redrive_after=redrive_after, ts=ts, after=run_id)
    return replace(applied, outbox_ids=[*applied.outbox_ids, *items]) if items else applied


def release_stalled(rt: Runtime, limit: int = 200) -> int:
    """Reaper safety net: release held runs whose thread has no active run (every path that
    ends a run should already have done it, in the same transaction)."""
    with rt.engine.connect() as conn:
        stalled = store.stalled_threads(conn, limit)
    released: list[OutboxItem] = []
    for thread_id in stalled:
        ts = repo.now()
        with rt.engine.begin() as conn:
            lock(conn, thread_id, ts)
            released += release_next(conn, thread_id, redrive_after=rt.settings.redrive_seconds,
                                     ts=ts)
    if released:
        log.warning("released %d held runs the ending transaction missed", len(released))
        rt.publish(released)
    return len(released)

