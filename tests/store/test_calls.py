"""The store's contract for tool calls (``shared.store.calls``), on SQLite and PostgreSQL: a
claim counts an attempt and takes a queued call (or one whose worker died) once; values are
set only from the statuses and at the attempt given (a fence); windowed batches queue their
next pending call in order."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import sqlalchemy as sa

from shared.engine.runtime import Runtime
from shared.store import calls as call_store
from shared.store import runs as run_store
from shared.store import workers
from shared.store.rows import CallStatus
from shared.vocab import EventType

TS = 1_800_000_000.0


def _calls(rt: Runtime, run_id: str, statuses: list[str]) -> None:
    row = {"id": run_id, "tenant": "t1", "kind": "agent", "status": "running"}
    rows: list[dict[str, Any]] = [
        {
            "run_id": run_id,
            "call_id": f"c{i}",
            "round": 1,
            "idx": i,
            "name": "echo",
            "arguments": "{}",
            "read_only": True,
            "status": s,
        }
        for i, s in enumerate(statuses)
    ]
    with rt.engine.begin() as conn:
        rt.store.insert_run(conn, row, {"agent": {"kind": "agent"}}, [], TS)
        call_store.insert_calls(conn, rows)


def test_a_claim_takes_a_queued_call_once_and_counts_the_attempt(rt: Runtime) -> None:
    _calls(rt, "run_c", ["queued"])
    with rt.engine.begin() as conn:
        workers.register(conn, "w1", "host", 1, TS)  # a live worker: its heartbeat is fresh
        first = call_store.claim_call(conn, "run_c", "c0", "w1", TS, TS - 30)
        again = call_store.claim_call(conn, "run_c", "c0", "w2", TS, TS - 30)
    assert first is not None and first.status == CallStatus.RUNNING and first.attempts == 1
    assert first.lease_owner == "w1" and first.started_at == TS
    assert again is None  # running, and its worker lives
    with rt.engine.connect() as conn:
        assert call_store.holds_call(conn, "run_c", "c0", "w1", 1)
        assert not call_store.holds_call(conn, "run_c", "c0", "w1", 2)


def test_a_call_whose_worker_died_is_taken_over(rt: Runtime) -> None:
    _calls(rt, "run_d", ["queued"])
    with rt.engine.begin() as conn:
        call_store.claim_call(conn, "run_d", "c0", "dead-worker", TS, TS - 30)
    with rt.engine.begin() as conn:  # no worker row beats for "dead-worker": its lease is gone
        taken = call_store.claim_call(conn, "run_d", "c0", "w2", TS + 1, TS - 30)
    assert taken is not None and taken.attempts == 2 and taken.lease_owner == "w2"
    assert taken.started_at == TS  # the first start stays


def test_set_calls_is_fenced_by_status_and_attempt(rt: Runtime) -> None:
    _calls(rt, "run_f", ["running", "queued"])
    done = {"status": "done", "result": "ok", "lease_owner": None}
    with rt.engine.begin() as conn:
        wrong = call_store.set_calls(conn, "run_f", ["c0"], done, from_status=[CallStatus.QUEUED])
        stale = call_store.set_calls(
            conn, "run_f", ["c0"], done, from_status=[CallStatus.RUNNING], attempts=3
        )
        right = call_store.set_calls(
            conn, "run_f", ["c0"], done, from_status=[CallStatus.RUNNING], attempts=0
        )
        both = call_store.set_calls(conn, "run_f", ["c0", "c1"], {"flushed": True})
    assert (wrong, stale, right, both) == (0, 0, 1, 2)
    with rt.engine.connect() as conn:
        got = {c.call_id: c for c in call_store.list_tool_calls(conn, "run_f")}
    assert got["c0"].status == CallStatus.DONE and got["c0"].lease_owner is None
    assert got["c0"].result == "ok" and got["c1"].flushed


def test_next_pending_queues_the_batch_in_call_order(rt: Runtime) -> None:
    _calls(rt, "run_p", ["done", "pending", "pending"])
    with rt.engine.begin() as conn:
        first = call_store.next_pending(conn, "run_p", 1, TS)
        second = call_store.next_pending(conn, "run_p", 1, TS)
        none = call_store.next_pending(conn, "run_p", 1, TS)
    assert (first, second, none) == ("c1", "c2", None)
    with rt.engine.connect() as conn:
        queued = [c for c in call_store.list_tool_calls(conn, "run_p", 1) if c.queued_at == TS]
    assert [c.call_id for c in queued] == ["c1", "c2"]


def test_a_call_and_its_run_are_read_together(rt: Runtime) -> None:
    _calls(rt, "run_j", ["queued", "queued"])
    with rt.engine.connect() as conn:
        found = call_store.call_and_run(conn, "run_j", "c1")
        assert call_store.call_and_run(conn, "run_j", "nope") is None
        among = call_store.call_ids_among(conn, "run_j", ["c1", "x"])
        roundmates = call_store.round_of_call(conn, "run_j", "c1")
    assert found is not None and found[0].id == "run_j" and found[1].call_id == "c1"
    assert among == {"c1"} and [c.call_id for c in roundmates] == ["c0", "c1"]


def test_a_tool_claim_takes_the_call_and_writes_its_started_event_once(rt: Runtime) -> None:
    """``Store.claim_call``: the call's claim, the run's event seq (not its version) and the
    ``tool.started`` event together; a second claim, or one of a run that moved on, takes
    nothing (its caller rolls back)."""
    _calls(rt, "run_t", ["queued"])
    with rt.engine.begin() as conn:
        workers.register(conn, "w1", "host", 1, TS)
        run = run_store.load_run(conn, "run_t")
        call = call_store.get_call(conn, "run_t", "c0")
        assert run is not None and call is not None
        found = rt.store.claim_call(conn, run, call, "w1", TS, TS - 30)
        assert found is not None
        new, took = found
        assert rt.store.claim_call(conn, new, call, "w2", TS, TS - 30) is None
    assert (new.version, new.event_seq) == (run.version, run.event_seq + 1)
    assert (took.status, took.attempts, took.lease_owner, took.started_at) == (
        CallStatus.RUNNING,
        1,
        "w1",
        TS,
    )
    assert took.arguments == call.arguments and took.name == "echo"
    with rt.engine.connect() as conn:
        stored = call_store.get_call(conn, "run_t", "c0")
        events = conn.execute(
            sa.text("SELECT seq, type, data FROM events WHERE run_id = 'run_t'")
        ).all()
    assert stored is not None and (stored.status, stored.attempts) == (CallStatus.RUNNING, 1)
    [(seq, type_, data)] = events
    data = data if isinstance(data, dict) else json.loads(data)
    assert (seq, type_) == (new.event_seq, EventType.TOOL_STARTED.value)
    assert data == {"call_id": "c0", "name": "echo", "round": 1, "attempt": 1}


def test_a_tool_claim_of_a_run_that_moved_on_takes_nothing(rt: Runtime) -> None:
    _calls(rt, "run_m", ["queued"])
    with rt.engine.connect() as conn:
        run = run_store.load_run(conn, "run_m")
        call = call_store.get_call(conn, "run_m", "c0")
    assert run is not None and call is not None
    with rt.engine.begin() as conn:
        moved = replace(run, version=run.version + 1)  # as read before another transition
        assert rt.store.claim_call(conn, moved, call, "w1", TS, TS - 30) is None
        conn.rollback()
    with rt.engine.connect() as conn:
        stored = call_store.get_call(conn, "run_m", "c0")
    assert stored is not None and stored.status == CallStatus.QUEUED and stored.attempts == 0
