"""What a run appends: its messages (with their token estimates), its events (the durable
log SSE replays) and its usage rows (one per model call). Append-only: a round inserts its
new rows, so the bytes written per round do not grow with the run."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from shared.agent.messages import Message
from shared.agent.tokens import estimate_message_tokens
from shared.store import lineage
from shared.store.tables import events, messages, usage

__all__ = [
    "USAGE_DEFAULTS",
    "usage_rows",
    "insert_events",
    "insert_messages",
    "insert_usage",
    "list_events",
    "list_events_of",
    "list_messages",
    "message_rows",
    "message_tokens",
    "own_messages",
]


# the hot inserts, built once (a statement built per call costs CPU on every round)
_INSERT_MESSAGES = sa.insert(messages)

_INSERT_EVENTS = sa.insert(events)

_INSERT_USAGE = sa.insert(usage)


def message_tokens(msgs: Sequence[tuple[Message, int]]) -> list[int]:
    """The estimated token count of each message (stored once, with the message)."""
    return [estimate_message_tokens(m) for m, _ in msgs]


def insert_messages(
    conn: Connection,
    run_id: str,
    first_seq: int,
    msgs: Sequence[tuple[Message, int]],
    ts: float,
    tokens: Sequence[int] | None = None,
) -> None:
    if not msgs:
        return
    rows = message_rows(run_id, msgs, ts, tokens)
    conn.execute(_INSERT_MESSAGES, [{**r, "seq": first_seq + i} for i, r in enumerate(rows)])


def message_rows(
    run_id: str, msgs: Sequence[tuple[Message, int]], ts: float, tokens: Sequence[int] | None
) -> list[dict[str, Any]]:
    """The ``messages`` rows of these messages, without their seqs."""
    counts = tokens if tokens is not None else message_tokens(msgs)
    rows = []
    for (m, round_), n in zip(msgs, counts, strict=True):
        rows.append(
            {
                "run_id": run_id,
                "round": round_,
                "role": m.role,
                "content": m.content,
                "reasoning": m.reasoning or None,
                "tool_calls": [c.to_dict() for c in m.tool_calls] or None,
                "tool_call_id": m.tool_call_id,
                "name": m.name,
                "hidden": m.hidden,
                "kind": m.kind,
                "tokens": n,
                "created_at": ts,
            }
        )
    return rows


def list_messages(
    conn: Connection, run_id: str, from_seq: int = 0, *, raw: bool = False
) -> list[Mapping[Any, Any]]:
    """The run's transcript from ``from_seq``: its base's messages, read by reference, then
    its own (``shared.store.lineage``; ``raw``: a thread's history as it was written)."""
    return lineage.read(conn, run_id, from_seq, raw=raw)


def own_messages(conn: Connection, run_id: str, from_seq: int = 0) -> list[Mapping[Any, Any]]:
    """The messages the run itself wrote (not its base's)."""
    return list(conn.execute(_OWN_MESSAGES, {"b_run": run_id, "b_from": from_seq}).mappings())


_OWN_MESSAGES = (
    sa.select(messages)
    .where(messages.c.run_id == sa.bindparam("b_run"), messages.c.seq >= sa.bindparam("b_from"))
    .order_by(messages.c.seq)
)


def insert_events(
    conn: Connection,
    run_id: str,
    first_seq: int,
    evs: Sequence[tuple[str, dict[str, Any]]],
    ts: float,
) -> list[tuple[int, str, dict[str, Any]]]:
    """The event rows, numbered from ``first_seq``; returns them as (seq, type, data)."""
    numbered = [(first_seq + i, t, d) for i, (t, d) in enumerate(evs)]
    if numbered:
        conn.execute(
            _INSERT_EVENTS,
            [
                {"run_id": run_id, "seq": seq, "type": t, "data": d, "created_at": ts}
                for seq, t, d in numbered
            ],
        )
    return numbered


def list_events(
    conn: Connection, run_id: str, after: int = 0, limit: int = 1000
) -> list[Mapping[Any, Any]]:
    q = (
        sa.select(events)
        .where(events.c.run_id == run_id, events.c.seq > after)
        .order_by(events.c.seq)
        .limit(limit)
    )
    return list(conn.execute(q).mappings())


def list_events_of(conn: Connection, run_id: str, types: Sequence[str]) -> list[Mapping[Any, Any]]:
    """The run's events of these types, in order."""
    q = (
        sa.select(events)
        .where(events.c.run_id == run_id, events.c.type.in_(list(types)))
        .order_by(events.c.seq)
    )
    return list(conn.execute(q).mappings())


USAGE_DEFAULTS: dict[str, Any] = {
    "purpose": "round",
    "profile": None,
    "model": None,
    "input_tokens": 0,
    "output_tokens": 0,
    "cached_input_tokens": 0,
    "reasoning_tokens": 0,
    "cost": 0.0,
    "estimated": False,
    "committed": True,
    "latency_ms": None,
}
"""Every column of a usage row, so rows of one insert all have the same keys."""


def usage_rows(run_id: str, ts: float, rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The ``usage`` rows of these calls, each with every column."""
    return [{**USAGE_DEFAULTS, **u, "run_id": run_id, "created_at": ts} for u in rows]


def insert_usage(
    conn: Connection, run_id: str, rows: Sequence[Mapping[str, Any]], ts: float
) -> None:
    if rows:
        conn.execute(_INSERT_USAGE, usage_rows(run_id, ts, rows))


def usage_of_run(conn: Connection, run_id: str) -> list[dict[str, Any]]:
    """A run's usage rows (every call, committed or not), oldest first."""
    keep = (
        usage.c.round,
        usage.c.purpose,
        usage.c.profile,
        usage.c.model,
        usage.c.input_tokens,
        usage.c.output_tokens,
        usage.c.cached_input_tokens,
        usage.c.reasoning_tokens,
        usage.c.cost,
        usage.c.estimated,
        usage.c.committed,
        usage.c.latency_ms,
    )
    rows = conn.execute(sa.select(*keep).where(usage.c.run_id == run_id).order_by(usage.c.id))
    return [dict(r._mapping) for r in rows]
