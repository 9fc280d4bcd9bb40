"""Sub-agent runs and their ancestors (``shared.engine.children``): who a child's parents are,
the locks a change of a child takes root first, and the children a run is waiting on."""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from shared.store.rows import FINAL, CallStatus, Run, Status
from shared.store.tables import runs, tool_calls

__all__ = [
    "MAX_DEPTH",
    "Link",
    "active_children",
    "ancestors",
    "descendant_ids",
    "first_waiting_child",
    "lock_call",
]

MAX_DEPTH = 5
"""Nesting limit: a run this deep below its root does not start children."""


@dataclass(frozen=True, slots=True)
class Link:
    """An ancestor of a run, and its call that leads down towards the run."""

    run_id: str
    call_id: str
    thread_id: str | None


_LINK = sa.select(runs.c.id, runs.c.parent_run_id, runs.c.parent_call_id, runs.c.thread_id)


def ancestors(conn: Connection, run_id: str) -> list[Link]:
    """The run's ancestors, root first (unlocked reads: a run's parent and parent call never
    change)."""
    links: list[Link] = []
    row = conn.execute(_LINK.where(runs.c.id == run_id)).first()
    while row is not None and row.parent_run_id is not None and len(links) <= MAX_DEPTH:
        parent = conn.execute(_LINK.where(runs.c.id == row.parent_run_id)).first()
        if parent is None:
            break
        links.append(Link(str(parent.id), str(row.parent_call_id), parent.thread_id))
        row = parent
    return list(reversed(links))


def lock_call(conn: Connection, run_id: str, call_id: str) -> None:
    """The row lock of one tool call (an ancestor's call that leads down)."""
    conn.execute(
        sa.select(tool_calls.c.call_id)
        .where(tool_calls.c.run_id == run_id, tool_calls.c.call_id == call_id)
        .with_for_update()
    )


def first_waiting_child(conn: Connection, parent_id: str) -> Run | None:
    """The parent's paused child whose call is still open, in call order."""
    q = (
        sa.select(runs)
        .join(
            tool_calls,
            sa.and_(
                tool_calls.c.run_id == runs.c.parent_run_id,
                tool_calls.c.call_id == runs.c.parent_call_id,
            ),
        )
        .where(
            runs.c.parent_run_id == parent_id,
            runs.c.status == Status.WAITING.value,
            tool_calls.c.status == CallStatus.CHILD.value,
        )
        .order_by(tool_calls.c.round, tool_calls.c.idx)
        .limit(1)
    )
    row = conn.execute(q).mappings().first()
    return Run.of(row) if row is not None else None


def active_children(conn: Connection, run_id: str) -> list[Run]:
    """The run's children that are not final, oldest first."""
    q = (
        sa.select(runs)
        .where(runs.c.parent_run_id == run_id, runs.c.status.not_in([s.value for s in FINAL]))
        .order_by(runs.c.created_at, runs.c.id)
    )
    return [Run.of(r) for r in conn.execute(q).mappings()]


def descendant_ids(conn: Connection, run_id: str) -> list[str]:
    """Every run below ``run_id`` (children, their children, …), breadth first."""
    out: list[str] = []
    level = [run_id]
    for _ in range(MAX_DEPTH + 1):
        level = list(
            conn.execute(sa.select(runs.c.id).where(runs.c.parent_run_id.in_(level))).scalars()
        )
        if not level:
            break
        out += level
    return out
