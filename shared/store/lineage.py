"""A run's transcript by reference: its own messages after another run's, never copied.

A run may have a *base*: ``runs.base_run_id`` up to ``runs.base_seq``. Its transcript is the
base's transcript up to that seq (which may have a base of its own: a chain), then its own
messages, numbered from ``base_seq + 1``. Seqs therefore grow along the whole chain, and a
transcript is one ``ORDER BY seq`` over the chain's segments, whoever wrote them.

``base_kind`` says how the base is read:

- ``fork``: as it is (a fork carries on from the source's round N, shares its messages);
- ``thread``: as a thread's history (``shared.agent.thread``): each earlier run's own
  conversation, marked ``kind="history"``, without system prompts, checkpoints or hidden
  messages, and without tool calls left unanswered. Everything below a thread link is read so.

A thread's runs form one chain (each run's base is the thread run before it, up to the seq it
had when the new run started), so a thread of N runs stores each message once.

Runs stored before lineage existed have copies (``kind="history"``) of their thread's history
among their own messages; read as history, those copies are kept as they are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from shared.agent.messages import Message
from shared.agent.thread import HISTORY_KIND, history_view
from shared.agent.tokens import estimate_message_tokens
from shared.store.tables import messages, runs

__all__ = [
    "FORK",
    "THREAD",
    "Segment",
    "base_chain",
    "checkpoint_before",
    "message_from_row",
    "read",
    "read_chain",
    "segments",
    "view_tokens",
]

FORK, THREAD = "fork", "thread"
MAX_DEPTH = 100_000  # a guard, not a limit anyone reaches: bases are always older runs


@dataclass(frozen=True, slots=True)
class Segment:
    """The messages of ``run_id`` with ``after < seq <= upto`` (``upto`` None: all of them);
    ``history``: read as a thread's history."""

    run_id: str
    after: int
    upto: int | None
    history: bool

    def where(self, from_seq: int = 0) -> sa.ColumnElement[bool]:
        lower = self.after + 1 if self.history else max(self.after + 1, from_seq)
        cond = sa.and_(messages.c.run_id == self.run_id, messages.c.seq >= lower)
        return cond if self.upto is None else sa.and_(cond, messages.c.seq <= self.upto)


def segments(conn: Connection, run_id: str) -> list[Segment]:
    """The chain of ``run_id``, oldest segment first (one recursive query)."""
    r = runs.c
    top = sa.select(
        r.id, r.base_run_id, r.base_seq, r.base_kind, sa.literal(0).label("depth")
    ).where(r.id == run_id)
    chain = top.cte("chain", recursive=True)
    below = sa.select(
        r.id, r.base_run_id, r.base_seq, r.base_kind, (chain.c.depth + 1).label("depth")
    ).where(r.id == chain.c.base_run_id, chain.c.depth < MAX_DEPTH)
    chain = chain.union_all(below)
    rows = conn.execute(sa.select(chain).order_by(chain.c.depth)).mappings().all()
    out: list[Segment] = []
    upto: int | None = None
    history = False
    for row in rows:
        out.append(Segment(str(row["id"]), int(row["base_seq"] or 0), upto, history))
        base_seq = int(row["base_seq"] or 0)  # a cut below a base's own start carries down
        upto = base_seq if upto is None else min(upto, base_seq)
        history = history or row["base_kind"] == THREAD
    return out[::-1]


def message_from_row(row: Mapping[Any, Any]) -> Message:
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


def base_chain(conn: Connection, base_run_id: str, base_seq: int, kind: str) -> list[Segment]:
    """The segments a new run with this base would read before its own messages."""
    chain = segments(conn, base_run_id)
    if not chain:
        return []
    chain = [
        Segment(s.run_id, s.after, base_seq if s.upto is None else min(s.upto, base_seq), s.history)
        for s in chain
    ]
    if kind == THREAD:
        chain = [Segment(s.run_id, s.after, s.upto, True) for s in chain]
    return chain


def read(
    conn: Connection, run_id: str, from_seq: int = 0, *, raw: bool = False
) -> list[Mapping[Any, Any]]:
    """The run's transcript (``seq >= from_seq``) through its chain, in seq order. Rows carry
    the ``run_id`` that wrote them. History segments come as the model sees them, or with
    ``raw`` as they were written (each run's own messages, without old history copies)."""
    chain = segments(conn, run_id)
    if len(chain) <= 1:  # no base: the run's own rows
        return _rows(conn, sa.and_(messages.c.run_id == run_id, messages.c.seq >= from_seq))
    return read_chain(conn, chain, from_seq, raw=raw)


def read_chain(
    conn: Connection, chain: Sequence[Segment], from_seq: int = 0, *, raw: bool = False
) -> list[Mapping[Any, Any]]:
    """The messages of ``chain`` (see ``read``)."""
    if not chain:
        return []
    wanted = [s for s in chain if s.upto is None or s.upto >= from_seq]  # (seqs grow along it)
    rows = _rows(conn, sa.or_(*(s.where(from_seq) for s in wanted)))
    history = {s.run_id for s in wanted if s.history}
    if not history:
        return rows
    out: list[Mapping[Any, Any]] = []
    for run_rows in _by_run(rows):
        if run_rows[0]["run_id"] not in history:
            out += run_rows
        elif raw:
            out += [r for r in run_rows if r["kind"] != HISTORY_KIND]
        else:
            out += _as_history(run_rows)
    return [r for r in out if r["seq"] >= from_seq]


def _rows(conn: Connection, where: sa.ColumnElement[bool]) -> list[Mapping[Any, Any]]:
    q = sa.select(messages).where(where).order_by(messages.c.seq)
    return list(conn.execute(q).mappings())


def _by_run(rows: Sequence[Mapping[Any, Any]]) -> list[list[Mapping[Any, Any]]]:
    """Consecutive rows of one run (a chain's segments are seq ranges, one after another)."""
    out: list[list[Mapping[Any, Any]]] = []
    for row in rows:
        if out and out[-1][0]["run_id"] == row["run_id"]:
            out[-1].append(row)
        else:
            out.append([row])
    return out


def _as_history(rows: Sequence[Mapping[Any, Any]]) -> list[Mapping[Any, Any]]:
    kept = history_view([message_from_row(r) for r in rows])
    out: list[Mapping[Any, Any]] = []
    for i, m in kept:
        calls = [c.to_dict() for c in m.tool_calls] or None
        out.append({**rows[i], "kind": m.kind, "tool_calls": calls})
    return out


def checkpoint_before(conn: Connection, run_id: str, upto: int) -> int:
    """The seq of the last context checkpoint at or before ``upto`` in the run's transcript
    as it is (history segments have none the model sees); 0 when there is none."""
    chain = [s for s in segments(conn, run_id) if not s.history]
    if not chain:
        return 0
    cond = sa.or_(*(s.where() for s in chain))
    q = sa.select(sa.func.max(messages.c.seq)).where(
        cond, messages.c.seq <= upto, messages.c.kind == "context_checkpoint"
    )
    return int(conn.execute(q).scalar() or 0)


def view_tokens(conn: Connection, chain: Sequence[Segment], from_seq: int = 0) -> int:
    """The estimated tokens of the messages ``chain`` puts in a model view from ``from_seq``."""
    rows = read_chain(conn, chain, from_seq)
    return sum(estimate_message_tokens(message_from_row(r)) for r in rows)
