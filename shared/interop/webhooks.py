"""Webhook bodies of facade runs, rendered by the store when it records a
delivery: the run's webhook names its renderer (``render: "langgraph" | "openai"``), and the
runtime hands ``RENDERERS`` to the store (``Runtime.renderers``). They
run on the workers inside the transaction that wrote the event, so they only read.

* LangGraph: one POST per run end, pauses included: the Run, its ``values`` (with the
  interrupt on a pause) and ``error``.
* OpenAI: ``{"id": "evt_…", "object": "event", "type": "response.completed|failed|cancelled|
  incomplete", "created_at", "data": {"id": "resp_…"}}``.
* A2A: ``{"task": ...}``, the task at each pause (input-required) and at the end
  (``shared.interop.a2a_shapes``).

An event after a pause that no client resumed (a run cancelled while it waited) belongs to
no LangGraph run or response: nothing is sent.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy.engine import Connection

from shared.interop.a2a_shapes import A2A, a2a_body
from shared.interop.shapes import interrupt_of, lc_messages, lg_run_status, oa_status
from shared.interop.thread_ids import public_id
from shared.isotime import iso
from shared.store import segments as segs
from shared.store.deliveries import Event, Renderer, Row
from shared.vocab import EventType

__all__ = ["RENDERERS", "langgraph_body", "openai_body"]

Body = dict[str, Any]
Segment = tuple[str, int]  # (segment id, from_seq)
_SegmentRenderer = Callable[[Connection, Row, Event, Body, Segment], Body | None]
_OA_TYPES = {
    "completed": "response.completed",
    "incomplete": "response.incomplete",
    "failed": "response.failed",
    "cancelled": "response.cancelled",
}


def _of_segments(protocol: str) -> Callable[[_SegmentRenderer], Renderer]:
    """A renderer of ``protocol``'s segments (facade runs and responses): the one the event
    belongs to is the last argument; an event after a pause that no client resumed belongs to
    none, and sends nothing."""

    def wrap(render: _SegmentRenderer) -> Renderer:
        @functools.wraps(render)
        def rendered(conn: Connection, run: Row, event: Event, doc: Body) -> Body | None:
            segment = segs.segment_of_event(conn, protocol, run["id"], event[0])
            return None if segment is None else render(conn, run, event, doc, segment)

        return rendered

    return wrap


@_of_segments(segs.LANGGRAPH)
def langgraph_body(
    conn: Connection, run: Row, event: Event, doc: Body, segment: Segment
) -> Body | None:
    seg_id, from_seq = segment
    _, type_, data = event
    now, started = time.time(), segs.started_at(conn, run, from_seq)
    values: dict[str, Any] = {"messages": lc_messages(segs.thread_rows(conn, run))}
    if type_ == EventType.RUN_WAITING:
        values["__interrupt__"] = [interrupt_of(data.get("pending") or {})]
    cfg = run.get("webhook") or {}
    body: dict[str, Any] = {
        "run_id": seg_id,
        "thread_id": public_id(run["thread_id"]) if run["thread_id"] else None,
        "assistant_id": cfg.get("assistant", ""),
        "created_at": iso(started),
        "updated_at": iso(now),
        "status": lg_run_status(run, {"type": type_, "data": data}),
        "metadata": run.get("meta") or {},
        "kwargs": {},
        "multitask_strategy": "enqueue",
        "run_started_at": iso(started),
        "run_ended_at": iso(now),
        "webhook_sent_at": iso(now),
        "values": values,
    }
    if type_ == EventType.RUN_FAILED:
        body["error"] = str((data.get("error") or {}).get("message") or "the run failed")
    resume = (doc.get("data") or {}).get("resume")
    if resume:
        body["treadle"] = {"resume": resume}
    return body


@_of_segments(segs.OPENAI)
def openai_body(
    conn: Connection, run: Row, event: Event, doc: Body, segment: Segment
) -> Body | None:
    seq, type_, data = event
    status = oa_status(run, {"type": type_, "data": data})
    kind = _OA_TYPES.get(status)
    if kind is None:
        return None
    event_id = uuid.uuid5(uuid.NAMESPACE_URL, f"treadle:{run['id']}:{seq}").hex
    return {
        "id": f"evt_{event_id}",
        "object": "event",
        "type": kind,
        "created_at": int(time.time()),
        "data": {"id": segment[0]},
    }


RENDERERS: Mapping[str, Renderer] = {
    segs.LANGGRAPH: langgraph_body,
    segs.OPENAI: openai_body,
    A2A: a2a_body,  # an A2A task's push notifications
}
