"""The store's contract for a run's hot row and what it was given (``shared.store.runs``,
``Store.insert_run``), on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

from shared.agent.messages import Message
from shared.engine.runtime import Runtime
from shared.store import records
from shared.store import runs as run_store
from shared.store.rows import Status

TS = 1_800_000_000.0


def _row(run_id: str, **extra: Any) -> dict[str, Any]:
    return {"id": run_id, "tenant": "t1", "kind": "agent", "status": "queued", **extra}


def _insert(rt: Runtime, run_id: str, *, ts: float = TS, **extra: Any) -> bool:
    spec = {"agent": {"kind": "agent", "model": "demo"}, "inputs": {"k": 1}, "meta": {"m": 2}}
    msgs = [Message(role="user", content="hello"), Message(role="user", content="again")]
    with rt.engine.begin() as conn:
        return rt.store.insert_run(conn, _row(run_id, **extra), spec, msgs, ts)


def test_insert_run_numbers_its_messages_and_counts_their_tokens(rt: Runtime) -> None:
    assert _insert(rt, "run_a")
    with rt.engine.connect() as conn:
        run = run_store.load_run(conn, "run_a")
        stored = records.own_messages(conn, "run_a")
    assert run is not None and run.status == Status.QUEUED and run.version == 0
    assert run.msg_seq == 2 and run.view_tokens > 0
    assert run.created_at == run.updated_at == TS
    assert [(m["seq"], m["content"]) for m in stored] == [(1, "hello"), (2, "again")]


def test_insert_run_if_absent_says_whether_it_inserted(rt: Runtime) -> None:
    spec = {"agent": {"kind": "agent"}}
    with rt.engine.begin() as conn:
        assert rt.store.insert_run(conn, _row("run_b"), spec, [], TS, if_absent=True)
    with rt.engine.begin() as conn:
        assert not rt.store.insert_run(conn, _row("run_b"), spec, [], TS, if_absent=True)


def test_a_tenant_sees_its_own_runs_only(rt: Runtime) -> None:
    _insert(rt, "run_c")
    with rt.engine.connect() as conn:
        assert run_store.load_run(conn, "run_c", "t1") is not None
        assert run_store.load_run(conn, "run_c", "t2") is None
        assert run_store.get_run(conn, "run_c", "t2") is None
        record = run_store.get_run(conn, "run_c", "t1")
    assert record is not None and record.agent == {"kind": "agent", "model": "demo"}
    assert record.inputs == {"k": 1} and record.meta == {"m": 2}


def test_list_runs_pages_newest_first_and_filters(rt: Runtime) -> None:
    for i in range(5):
        _insert(rt, f"run_l{i}", ts=TS + i, status="completed" if i % 2 else "queued")
    with rt.engine.connect() as conn:
        first = run_store.list_runs(conn, "t1", limit=2)
        last = first[-1]
        rest = run_store.list_runs(conn, "t1", limit=10, before=(last.created_at, last.id))
        done = run_store.list_runs(conn, "t1", status="completed")
        other = run_store.list_runs(conn, "t2")
    assert [r.id for r in first] == ["run_l4", "run_l3"]
    assert [r.id for r in rest] == ["run_l2", "run_l1", "run_l0"]
    assert {r.id for r in done} == {"run_l1", "run_l3"} and other == []


def test_an_idempotency_key_finds_the_run_of_its_tenant(rt: Runtime) -> None:
    _insert(rt, "run_i", idempotency_key="k1")
    with rt.engine.connect() as conn:
        found = run_store.find_idempotent(conn, "t1", "k1")
        assert run_store.find_idempotent(conn, "t2", "k1") is None
    assert found is not None and found.id == "run_i"


def test_what_a_run_was_given_is_read_and_set(rt: Runtime) -> None:
    _insert(rt, "run_s")
    with rt.engine.begin() as conn:
        run_store.set_agent(conn, "run_s", {"kind": "agent", "model": "other"})
        run_store.set_inputs(conn, "run_s", None)
    with rt.engine.connect() as conn:
        agent, inputs = run_store.run_spec(conn, "run_s")
        assert run_store.run_meta(conn, "run_s") == {"m": 2}
        assert run_store.spec_rev(conn, "run_s") == 0
        assert run_store.run_trace(conn, "run_s") is None
    assert agent["model"] == "other" and inputs is None


def test_release_round_gives_the_round_back_to_its_owner_only(rt: Runtime) -> None:
    _insert(rt, "run_r", lease_owner="w1", attempts=2)
    with rt.engine.begin() as conn:
        assert not run_store.release_round(conn, "run_r", 0, "w2", None)
        assert run_store.release_round(conn, "run_r", 0, "w1", TS + 5, counted=False, sent=TS)
        run = run_store.load_run(conn, "run_r")
    assert run is not None and run.lease_owner is None and run.wake_at == TS + 5
    assert run.attempts == 1 and run.dispatched_at == TS
