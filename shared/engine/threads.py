"""Threads: runs on a thread take its earlier messages as history; a thread has
at most one active run; a run submitted to a busy thread follows the thread's ``multitask``
policy (reject | enqueue | interrupt — the interrupt itself is in ``commands``).

History is read by reference, never copied: a starting run's base is the thread's last
started run, up to the seq that run had then (``shared.store.lineage``, kind ``thread``), so
the thread's runs form one chain and a thread of N runs stores each message once.

An enqueued run is created ``queued`` and ``held``: no outbox row, so nothing publishes it.
The transaction that ends the thread's active run releases the next held run (its base set
then, so it sees the finished run's messages) — one transaction, no window.

Lock order: any transaction that submits to a thread or ends a run on one locks the thread
row first (``shared.store.threads.lock_thread``), then run and tool-call rows (ancestors'
runs rows before a child's: ``shared.engine.children``); ``Tx.apply``
(``shared.engine.tx``) does it for every change that ends a run, and its follow-up here
(``follow_up``) releases the thread's next held run in the same transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import Connection

from shared.agent.messages import Message
from shared.engine.change import Change
from shared.engine.runtime import Runtime
from shared.engine.tx import Applied, Tx
from shared.errors import SpecError
from shared.store import lineage
from shared.store import runs as run_store
from shared.store import threads as store
from shared.store.rows import FINAL
from shared.vocab import EventType

__all__ = [
    "HELPER_KINDS",
    "MULTITASK",
    "QUEUED_INPUT",
    "Admission",
    "base_of",
    "create_thread",
    "follow_up",
    "release_next",
    "start_inputs",
]

log = logging.getLogger("treadle.threads")

MULTITASK = ("reject", "enqueue", "interrupt")
HELPER_KINDS = frozenset({"classify", "extract", "expand_query"})
QUEUED_INPUT = "queued_input"
"""``run_specs.inputs`` key holding a held run's input messages until it is released (its
history must come before them, and is only known then)."""


@dataclass(frozen=True)
class Admission:
    """How a new run joins its thread: held (enqueued) or started on this base (the columns
    of its row that make the thread's earlier messages its history, ``base_of``)."""

    held: bool = False
    stamp: float | None = None  # the run's created_at: admission order on the thread
    base: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, Any] = field(default_factory=dict)


def create_thread(
    rt: Runtime, tenant: str, metadata: dict[str, Any] | None, multitask: str, thread_id: str
) -> Mapping[Any, Any]:
    if multitask not in MULTITASK:
        raise SpecError(f"multitask must be one of {', '.join(MULTITASK)}")
    row = {"id": thread_id, "tenant": tenant, "meta": metadata, "multitask": multitask}
    with rt.engine.begin() as conn:
        return store.insert_thread(conn, row, run_store.now())


def base_of(conn: Connection, thread_id: str, run_id: str) -> dict[str, Any]:
    """The base columns of a run starting on the thread: the thread's last started run, up to
    its last message, read as history; with the tokens that adds to the run's model view.
    Empty for the thread's first run."""
    last = store.last_started(conn, thread_id, other_than=run_id)
    if last is None:
        return {}
    chain = lineage.base_chain(conn, last.id, last.msg_seq, lineage.THREAD)
    return {
        "base_run_id": last.id,
        "base_seq": last.msg_seq,
        "base_kind": lineage.THREAD,
        "view_tokens": lineage.view_tokens(conn, chain),
    }


def start_inputs(
    conn: Connection, thread_id: str, kind: str, inputs: Mapping[str, Any] | None
) -> dict[str, Any]:
    """A starting run's inputs; a helper kind gets the thread's previous result of its kind
    as ``last_result`` (the previous result on the same thread is given as context)."""
    out = {k: v for k, v in (inputs or {}).items() if k != QUEUED_INPUT}
    if kind in HELPER_KINDS:
        previous = store.last_result(conn, thread_id, kind)
        if previous is not None:
            out["last_result"] = previous
    return out


def follow_up(tx: Tx, applied: Applied) -> Sequence[Change]:
    """A run on a thread ended: the thread's next held run starts (the thread is locked)."""
    change, before = applied.change, applied.before
    if change.status not in FINAL or not change.release_thread or before.thread_id is None:
        return ()
    nxt = release_next(tx, before.thread_id, after=before.id)
    return (nxt,) if nxt is not None else ()


def release_next(tx: Tx, thread_id: str, *, after: str | None = None) -> Change | None:
    """The change that starts the thread's oldest held run, if the thread has no active run
    (the thread is locked): its history is set now, then its queued input; its round is
    dispatched. None: nothing to start."""
    if store.active_run(tx.conn, thread_id) is not None:
        return None
    nxt = store.next_held(tx.conn, thread_id)
    if nxt is None:
        return None
    _agent, inputs = run_store.run_spec(tx.conn, nxt.id)
    queued = [Message.from_dict(m) for m in (inputs or {}).get(QUEUED_INPUT) or ()]
    run_store.set_inputs(
        tx.conn, nxt.id, start_inputs(tx.conn, thread_id, nxt.kind, inputs) or None
    )
    run_store.set_base(tx.conn, nxt.id, base_of(tx.conn, thread_id, nxt.id))
    change = Change(nxt, queue_round=True)
    for m in queued:
        change.message(m, 0)
    change.values["held"] = False
    change.event(EventType.RUN_RELEASED, after=after)
    return change
