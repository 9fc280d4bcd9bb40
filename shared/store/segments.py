"""Segments: one LangGraph run, or one OpenAI response, is one leg of a treadle run.

A treadle run that pauses stays one run (``waiting`` → answer → ``running``); both protocols
resume with a *new* run / response. So a segment covers the run's durable events after
``from_seq`` (0 at the start; after a resume, the seq of the ``run.waiting`` it resumed) up to
and including the first pause or terminal event (its *end*). Segment ids are a function of
(protocol, run, from_seq), so the engine's webhook renderers name the segment of any event
without reading this table; the table maps ids back to runs and keeps what the client sent.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from shared.store import records
from shared.store import runs as run_store
from shared.store import threads as thread_store
from shared.store.tables import events, facade_segments, messages, runs, tool_calls, usage
from shared.vocab import SEGMENT_ENDS, EventType

__all__ = [
    "LANGGRAPH",
    "OPENAI",
    "Leg",
    "add_segment",
    "close_segments",
    "end_event",
    "get_segment",
    "last_waiting_seq",
    "load_leg",
    "open_leg",
    "resumed",
    "segment_id",
    "segment_of_event",
    "started_at",
    "thread_rows",
    "thread_segments",
    "tool_rows",
    "usage_of",
]

LANGGRAPH, OPENAI = "langgraph", "openai"
_NS = uuid.UUID("6f1d3c1e-6a53-4c39-9b0e-5d1f0c7f7a16")


def segment_id(protocol: str, run_id: str, from_seq: int) -> str:
    """LangGraph: a UUID; OpenAI: ``resp_`` + hex. The same leg always has the same id."""
    u = uuid.uuid5(_NS, f"{protocol}:{run_id}:{from_seq}")
    return str(u) if protocol == LANGGRAPH else f"resp_{u.hex}"


@dataclass(frozen=True)
class Leg:
    """A segment with what its status depends on: its run, and the event that ended it."""

    segment: Mapping[Any, Any]
    run: Mapping[Any, Any]
    end: Mapping[Any, Any] | None

    @property
    def closed(self) -> bool:
        return self.end is not None

    @property
    def end_seq(self) -> int | None:
        return int(self.end["seq"]) if self.end is not None else None


def add_segment(
    conn: Connection,
    protocol: str,
    tenant: str,
    run: Mapping[Any, Any],
    from_seq: int,
    assistant_id: str,
    meta: dict[str, Any] | None,
    options: dict[str, Any],
) -> Mapping[Any, Any]:
    """Record a segment (idempotent: a retried create or resume finds the first row)."""
    seg_id = segment_id(protocol, run["id"], from_seq)
    found = _by_id(conn, seg_id)
    if found is not None:
        return found
    ts = run_store.now()
    row = {
        "id": seg_id,
        "protocol": protocol,
        "tenant": tenant,
        "thread_id": run["thread_id"],
        "run_id": run["id"],
        "from_seq": from_seq,
        "assistant_id": assistant_id,
        "meta": meta,
        "options": options,
        "created_at": ts,
        "updated_at": ts,
    }
    try:
        with conn.begin_nested():
            conn.execute(sa.insert(facade_segments).values(**row))
    except IntegrityError:
        pass
    found = _by_id(conn, seg_id)
    assert found is not None
    return found


def _by_id(conn: Connection, seg_id: str) -> Mapping[Any, Any] | None:
    q = sa.select(facade_segments).where(facade_segments.c.id == seg_id)
    return conn.execute(q).mappings().first()


def get_segment(
    conn: Connection, seg_id: str, tenant: str, protocol: str
) -> Mapping[Any, Any] | None:
    q = sa.select(facade_segments).where(
        facade_segments.c.id == seg_id,
        facade_segments.c.tenant == tenant,
        facade_segments.c.protocol == protocol,
    )
    return conn.execute(q).mappings().first()


def thread_segments(
    conn: Connection, thread_id: str, protocol: str, limit: int = 100, offset: int = 0
) -> list[Mapping[Any, Any]]:
    """The thread's segments, newest first."""
    q = (
        sa.select(facade_segments)
        .where(facade_segments.c.thread_id == thread_id, facade_segments.c.protocol == protocol)
        .order_by(facade_segments.c.created_at.desc(), facade_segments.c.from_seq.desc())
        .limit(limit)
        .offset(offset)
    )
    return list(conn.execute(q).mappings())


def end_event(conn: Connection, run_id: str, from_seq: int) -> Mapping[Any, Any] | None:
    """The first pause or terminal event after ``from_seq``: where the segment ends."""
    q = (
        sa.select(events)
        .where(events.c.run_id == run_id, events.c.seq > from_seq, events.c.type.in_(SEGMENT_ENDS))
        .order_by(events.c.seq)
        .limit(1)
    )
    return conn.execute(q).mappings().first()


def last_waiting_seq(conn: Connection, run_id: str, before: int | None = None) -> int:
    """The seq of the run's latest ``run.waiting`` (before ``before``), else 0."""
    q = sa.select(sa.func.max(events.c.seq)).where(
        events.c.run_id == run_id, events.c.type == EventType.RUN_WAITING
    )
    if before is not None:
        q = q.where(events.c.seq < before)
    return int(conn.execute(q).scalar() or 0)


def segment_of_event(
    conn: Connection, protocol: str, run_id: str, seq: int
) -> tuple[str, int] | None:
    """(segment id, from_seq) of the segment an event belongs to; None: the event came after
    a pause that no client resumed (it belongs to no segment of ``protocol``)."""
    from_seq = last_waiting_seq(conn, run_id, before=seq)
    if not resumed(conn, run_id, from_seq, seq):
        return None
    return segment_id(protocol, run_id, from_seq), from_seq


def resumed(conn: Connection, run_id: str, from_seq: int, seq: int) -> bool:
    """Did a client resume the pause at ``from_seq`` (a ``run.resumed`` before ``seq``)?"""
    if from_seq == 0:
        return True
    q = sa.select(events.c.seq).where(
        events.c.run_id == run_id,
        events.c.seq > from_seq,
        events.c.seq < seq,
        events.c.type == EventType.RUN_RESUMED,
    )
    return conn.execute(q.limit(1)).first() is not None


def started_at(conn: Connection, run: Mapping[str, Any], from_seq: int) -> float:
    """When the segment from ``from_seq`` started: the run's creation, or its resume point."""
    if from_seq == 0:
        return float(run["created_at"])
    q = sa.select(events.c.created_at).where(events.c.run_id == run["id"], events.c.seq == from_seq)
    return float(conn.execute(q).scalar() or run["created_at"])


def load_leg(conn: Connection, segment: Mapping[Any, Any]) -> Leg:
    run = run_store.get_run(conn, segment["run_id"])
    assert run is not None, f"segment {segment['id']} lost its run"
    end = end_event(conn, segment["run_id"], segment["from_seq"])
    return Leg(segment=segment, run=run, end=end)


def open_leg(
    conn: Connection,
    protocol: str,
    tenant: str,
    run_id: str,
    from_seq: int,
    assistant_id: str,
    meta: dict[str, Any] | None,
    options: dict[str, Any],
) -> Leg:
    """The run's segment from ``from_seq`` (0: its start; else the ``run.waiting`` seq it
    resumes, which closes the segments before it), recorded once, as a leg."""
    run = run_store.get_run(conn, run_id)
    assert run is not None
    if from_seq:
        close_segments(conn, run_id, from_seq)
    seg = add_segment(conn, protocol, tenant, run, from_seq, assistant_id, meta, options)
    return load_leg(conn, seg)


def close_segments(conn: Connection, run_id: str, to_seq: int) -> None:
    """Fill ``to_seq`` of the run's segments that ended at ``to_seq`` (a resume or a cancel
    saw it); readers do not need it (they find the end event), people reading the table do."""
    conn.execute(
        sa.update(facade_segments)
        .where(
            facade_segments.c.run_id == run_id,
            facade_segments.c.to_seq.is_(None),
            facade_segments.c.from_seq < to_seq,
        )
        .values(to_seq=to_seq, updated_at=run_store.now())
    )


def thread_rows(conn: Connection, run: Mapping[Any, Any]) -> list[Mapping[Any, Any]]:
    """The messages of the run's thread up to and including the run (each run's own, runs in
    order, as written): the run's transcript through its base (a fork follows its branch)."""
    if run["thread_id"] is None or run["base_run_id"] is not None:
        return records.list_messages(conn, run["id"], raw=True)
    # a run without a base: its thread's first, or one stored before lineage (with copies)
    order = [r["id"] for r in thread_store.thread_runs(conn, run["thread_id"])]
    keep = set(order[: order.index(run["id"]) + 1]) if run["id"] in order else {run["id"]}
    rows = thread_store.thread_messages(conn, run["thread_id"], started_only=True)
    return [r for r in rows if r["run_id"] in keep]


def tool_rows(conn: Connection, run_id: str) -> dict[str, Mapping[Any, Any]]:
    q = sa.select(tool_calls).where(tool_calls.c.run_id == run_id)
    return {r["call_id"]: r for r in conn.execute(q).mappings()}


def usage_of(conn: Connection, run_id: str, rounds: set[int]) -> dict[str, int]:
    """Token totals of the run's model calls in ``rounds``."""
    if not rounds:
        return {"input_tokens": 0, "output_tokens": 0, "cached_input_tokens": 0}
    q = sa.select(
        sa.func.coalesce(sa.func.sum(usage.c.input_tokens), 0),
        sa.func.coalesce(sa.func.sum(usage.c.output_tokens), 0),
        sa.func.coalesce(sa.func.sum(usage.c.cached_input_tokens), 0),
    ).where(usage.c.run_id == run_id, usage.c.round.in_(sorted(rounds)))
    i, o, c = conn.execute(q).one()
    return {"input_tokens": int(i), "output_tokens": int(o), "cached_input_tokens": int(c)}


def run_messages_after(conn: Connection, run_id: str, ts: float) -> list[Mapping[Any, Any]]:
    q = (
        sa.select(messages)
        .where(messages.c.run_id == run_id, messages.c.created_at > ts)
        .order_by(messages.c.seq)
    )
    return list(conn.execute(q).mappings())


def latest_run(conn: Connection, thread_id: str) -> Mapping[Any, Any] | None:
    """The thread's newest run (held ones included)."""
    q = (
        sa.select(runs)
        .where(runs.c.thread_id == thread_id)
        .order_by(runs.c.created_at.desc(), runs.c.id.desc())
        .limit(1)
    )
    return conn.execute(q).mappings().first()
