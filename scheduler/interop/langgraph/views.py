"""The LangGraph shapes of treadle's rows: a run (a segment) and a thread as the SDK reads
them, and a thread's state at a checkpoint (``checkpoint_id`` = ``<run id>:<event seq>``: the
pause or end event that closed a round), now or as a segment ended."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy.engine import Connection

from shared.interop.shapes import (
    interrupt_of,
    lc_messages,
    lg_run_status,
    lg_thread_status,
)
from shared.interop.thread_ids import public_id
from shared.isotime import iso
from shared.store import records
from shared.store import runs as run_store
from shared.store import segments as segs
from shared.vocab import SEGMENT_ENDS, EventType

__all__ = [
    "checkpoint_seq",
    "current_state",
    "final_values",
    "round_at",
    "run_view",
    "state_at_end",
    "thread_view",
]


def run_view(leg: segs.Leg) -> dict[str, Any]:
    seg, opts = leg.segment, leg.segment["options"] or {}
    return {
        "run_id": seg["id"],
        "thread_id": public_id(seg["thread_id"]),
        "assistant_id": seg["assistant_id"],
        "created_at": iso(seg["created_at"]),
        "updated_at": iso(seg["updated_at"]),
        "status": lg_run_status(leg.run, leg.end),
        "metadata": seg["meta"] or {},
        "kwargs": opts.get("kwargs") or {},
        "multitask_strategy": opts.get("multitask_strategy") or "enqueue",
    }


def _thread_values(conn: Connection, latest: Mapping[Any, Any] | None) -> dict[str, Any]:
    rows = segs.thread_rows(conn, latest) if latest is not None else []
    return {"messages": lc_messages(rows)}


def _pending_interrupt(latest: Mapping[Any, Any] | None) -> dict[str, Any] | None:
    if latest is None or latest["status"] != "waiting" or not latest["pending"]:
        return None
    if latest["pending"].get("kind") == "provider":  # waiting out an outage: no interrupt
        return None
    return interrupt_of(latest["pending"])


def thread_view(conn: Connection, thread: Mapping[Any, Any]) -> dict[str, Any]:
    latest = segs.latest_run(conn, thread["id"])
    interrupt = _pending_interrupt(latest)
    return {
        "thread_id": public_id(thread["id"]),
        "created_at": iso(thread["created_at"]),
        "updated_at": iso(thread["updated_at"]),
        "metadata": thread["meta"] or {},
        "status": lg_thread_status(latest),
        "values": _thread_values(conn, latest),
        "interrupts": {interrupt["id"]: [interrupt]} if interrupt else {},
        "config": {},
        "error": None,
    }


def _state(
    thread_id: str,
    values: dict[str, Any],
    run: Mapping[Any, Any] | None,
    seq: int,
    interrupt: dict[str, Any] | None,
) -> dict[str, Any]:
    node = (
        "ask_user"
        if (interrupt or {}).get("value", {}).get("treadle", {}).get("kind") == "ask"
        else "tools"
    )
    tasks = (
        [
            {
                "id": interrupt["id"],
                "name": node,
                "path": [],
                "error": None,
                "interrupts": [interrupt],
                "checkpoint": None,
                "state": None,
                "result": None,
            }
        ]
        if interrupt
        else []
    )
    checkpoint = {
        "thread_id": public_id(thread_id),
        "checkpoint_ns": "",
        "checkpoint_id": f"{run['id']}:{seq}" if run is not None else public_id(thread_id),
    }
    return {
        "values": values,
        "next": [node] if interrupt else [],
        "tasks": tasks,
        "checkpoint": checkpoint,
        "metadata": {},
        "parent_checkpoint": _fork_parent(thread_id, run),
        "created_at": iso(run["updated_at"]) if run is not None else None,
        "interrupts": [interrupt] if interrupt else [],
    }


def _fork_parent(thread_id: str, run: Mapping[Any, Any] | None) -> dict[str, Any] | None:
    """A run that started from a checkpoint (a fork) has it as its parent checkpoint."""
    if run is None or run.get("base_kind") != "fork" or not run.get("fork_point"):
        return None
    return {
        "thread_id": public_id(thread_id),
        "checkpoint_ns": "",
        "checkpoint_id": run["fork_point"],
    }


def _with_fork_point(conn: Connection, run: Mapping[Any, Any] | None) -> Any:
    """The run, with ``fork_point``: the checkpoint id a fork started from."""
    if run is None or run.get("base_kind") != "fork":
        return run
    seq = checkpoint_seq(conn, str(run["base_run_id"]), int(run["fork_round"] or 0))
    return {**run, "fork_point": f"{run['base_run_id']}:{seq}"}


def checkpoint_seq(conn: Connection, run_id: str, round_: int) -> int:
    """The event seq of the checkpoint that ends round N: its pause or end event (what the
    facade names checkpoints by), else the last event before the next round started."""
    current, found, before_next = 0, 0, 0
    for ev in records.list_events_of(conn, run_id, (EventType.ROUND_STARTED, *SEGMENT_ENDS)):
        if ev["type"] == EventType.ROUND_STARTED:
            current = int((ev["data"] or {}).get("round") or 0)
            if current > round_:
                before_next = before_next or int(ev["seq"]) - 1
        elif current == round_:
            found = int(ev["seq"])
    if found or before_next:
        return found or before_next
    latest = run_store.load_run(conn, run_id)
    return latest.event_seq if latest is not None else 0


def round_at(conn: Connection, run_id: str, seq: int) -> int:
    """The round a checkpoint (an event seq) of the run is at: the last round started by it."""
    round_ = 0
    for ev in records.list_events_of(conn, run_id, (EventType.ROUND_STARTED,)):
        if int(ev["seq"]) > seq:
            break
        round_ = int((ev["data"] or {}).get("round") or 0)
    return round_


def current_state(conn: Connection, thread_id: str) -> dict[str, Any]:
    latest = _with_fork_point(conn, segs.latest_run(conn, thread_id))
    seq = latest["event_seq"] if latest is not None else 0
    return _state(thread_id, _thread_values(conn, latest), latest, seq, _pending_interrupt(latest))


def state_at_end(conn: Connection, leg: segs.Leg) -> dict[str, Any] | None:
    if leg.end is None:
        return None
    rows = segs.thread_rows(conn, leg.run)
    values = {"messages": lc_messages(rows, leg.run["id"], upto=leg.end["created_at"])}
    pending = (
        (leg.end["data"] or {}).get("pending") if leg.end["type"] == EventType.RUN_WAITING else None
    )
    return _state(
        leg.segment["thread_id"],
        values,
        _with_fork_point(conn, leg.run),
        int(leg.end["seq"]),
        interrupt_of(pending) if pending else None,
    )


def final_values(conn: Connection, leg: segs.Leg) -> dict[str, Any]:
    """What join and wait return: the values as the segment ended, with its interrupt or
    error (``__interrupt__``, ``__error__``)."""
    end = leg.end
    rows = segs.thread_rows(conn, leg.run)
    values: dict[str, Any] = {
        "messages": lc_messages(
            rows, leg.run["id"], upto=end["created_at"] if end is not None else None
        )
    }
    data = dict(end["data"] or {}) if end is not None else {}
    if end is not None and end["type"] == EventType.RUN_WAITING:
        values["__interrupt__"] = [interrupt_of(data.get("pending") or {})]
    if end is not None and end["type"] == EventType.RUN_FAILED:
        err = data.get("error") or {}
        values["__error__"] = {
            "error": str(err.get("code") or "Error"),
            "message": str(err.get("message") or "the run failed"),
        }
    return values
