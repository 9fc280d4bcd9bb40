"""Worker processes and their heartbeats. A lease on a run's round or on a tool call names a
worker (``lease_owner``); it is live while that worker's ``seen_at`` is fresh, so one small
UPDATE per process every few seconds keeps every lease the process holds. A live process
also gives back the leases it holds but no thread of it works on (``held``, ``give_back``):
a round whose commit failed, a tool task that raised."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from shared.store.records import insert_usage
from shared.store.rows import CallStatus
from shared.store.tables import runs, tool_calls, workers

__all__ = ["beat", "give_back", "held", "prune", "received_marks", "register"]


def register(conn: Connection, worker_id: str, host: str, pid: int, ts: float) -> None:
    conn.execute(
        sa.insert(workers).values(id=worker_id, host=host, pid=pid, started_at=ts, seen_at=ts)
    )


def beat(
    conn: Connection, worker_id: str, ts: float, received: dict[str, float] | None = None
) -> bool:
    """Refresh the heartbeat (and what the worker took from its queues: per
    "queue/priority", the send time of the newest dispatch); False = the row is gone
    (pruned as dead)."""
    values: dict[str, object] = {"seen_at": ts}
    if received:
        values["received"] = received
    stmt = sa.update(workers).where(workers.c.id == worker_id).values(**values)
    return conn.execute(stmt).rowcount == 1


def received_marks(conn: Connection) -> dict[str, float]:
    """Per "queue/priority", the send time of the newest dispatch any worker took (a dead
    worker's marks count too: what left a queue left it)."""
    marks: dict[str, float] = {}
    for (received,) in conn.execute(sa.select(workers.c.received)):
        for key, sent in (received or {}).items():
            marks[key] = max(marks.get(key, 0.0), float(sent))
    return marks


def prune(conn: Connection, before: float) -> int:
    """Forget workers not seen since ``before`` (their leases are long dead)."""
    return int(conn.execute(sa.delete(workers).where(workers.c.seen_at < before)).rowcount)


def held(conn: Connection, owner: str) -> tuple[list[tuple[str, int]], list[tuple[str, str, int]]]:
    """The rounds (run id, version) and running tool calls (run id, call id, attempt) whose
    lease ``owner`` holds."""
    rounds = conn.execute(sa.select(runs.c.id, runs.c.version).where(runs.c.lease_owner == owner))
    c = tool_calls.c
    calls = conn.execute(
        sa.select(c.run_id, c.call_id, c.attempts).where(
            c.lease_owner == owner, c.status == CallStatus.RUNNING.value
        )
    )
    return [(str(i), int(v)) for i, v in rounds], [(str(r), str(k), int(a)) for r, k, a in calls]


def give_back(
    conn: Connection,
    owner: str,
    rounds: list[tuple[str, int]],
    calls: list[tuple[str, str, int]],
    ts: float,
    owed: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
) -> int:
    """Free these leases of ``owner`` (each still at the version or attempt it was seen at):
    the round is due again, the call queued again (the reaper re-sends both). ``owed``: by
    run, the usage rows of model calls a round made and could not write (its commit and its
    release failed on a database outage); written, and added to the run's cost, with its
    give-back."""
    n = 0
    for run_id, version in rounds:
        stmt = (
            sa.update(runs)
            .where(runs.c.id == run_id, runs.c.version == version, runs.c.lease_owner == owner)
            .values(lease_owner=None)
        )
        freed = conn.execute(stmt).rowcount
        n += freed
        if freed and owed and owed.get(run_id):
            _bill(conn, run_id, owed[run_id], ts)
    c = tool_calls.c
    for run_id, call_id, attempt in calls:
        stmt = (
            sa.update(tool_calls)
            .where(
                c.run_id == run_id,
                c.call_id == call_id,
                c.attempts == attempt,
                c.lease_owner == owner,
                c.status == CallStatus.RUNNING.value,
            )
            .values(status=CallStatus.QUEUED.value, lease_owner=None, queued_at=ts)
        )
        n += conn.execute(stmt).rowcount
    return n


def _bill(conn: Connection, run_id: str, rows: Sequence[Mapping[str, Any]], ts: float) -> None:
    insert_usage(conn, run_id, rows, ts)
    cost = sum(float(r.get("cost") or 0.0) for r in rows)
    conn.execute(sa.update(runs).where(runs.c.id == run_id).values(cost=runs.c.cost + cost))
