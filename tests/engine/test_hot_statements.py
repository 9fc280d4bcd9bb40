"""The hot statements built once (``shared.store.write``): the guarded UPDATE by shape, the round
claim that writes its own ``round.started``, on SQLite and PostgreSQL. The shape cache must not
change what a value means: ``None`` is SQL NULL (not JSON ``null``), ``Inc`` adds, a guard
still guards."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from shared.engine.runtime import Runtime
from shared.store import calls as call_store
from shared.store import lineage, records
from shared.store import runs as run_store
from shared.store.tables import events, runs
from shared.store.write import ROUND_STARTED, Inc, round_started, rows_beside, update_statement
from tests.engine.helpers import agent, submit


@pytest.fixture(params=["sqlite", "postgresql"])
def rt(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Runtime]:
    runtime: Runtime = request.getfixturevalue("sqlite_rt")
    if request.param == "postgresql":
        from dataclasses import replace

        runtime = replace(runtime, engine=request.getfixturevalue("pg_engine"))
    yield runtime


def _update(rt: Runtime, run_id: str, version: int, values: dict[str, Any], **kw: Any) -> Any:
    with rt.engine.begin() as conn:
        return rt.store.update_run(conn, run_id, version, values, ts=time.time(), **kw)


def test_the_guarded_update_by_shape_keeps_each_values_meaning(rt: Runtime) -> None:
    run_id = submit(rt, agent([{"text": "hi"}]))
    with rt.engine.connect() as conn:
        run = run_store.load_run(conn, run_id)
    assert run is not None
    new = _update(rt, run_id, run.version, {"pending": {"kind": "ask"}, "cost": Inc(0.25)})
    assert new.pending == {"kind": "ask"} and new.cost == pytest.approx(run.cost + 0.25)
    assert new.version == run.version + 1
    again = _update(rt, run_id, new.version, {"pending": None, "cost": Inc(0.25)})
    assert again.pending is None and again.cost == pytest.approx(run.cost + 0.5)
    with rt.engine.connect() as conn:  # SQL NULL, not the JSON text null
        nulls = conn.execute(
            sa.select(sa.func.count()).where(runs.c.id == run_id, runs.c.pending.is_(None))
        ).scalar_one()
    assert nulls == 1
    # a stale version, a guard that no longer holds, another owner: nothing changes
    assert _update(rt, run_id, new.version, {"pending": None}) is None
    assert _update(rt, run_id, again.version, {"round": 3}, guard={"open_calls": 7}) is None
    assert _update(rt, run_id, again.version, {"round": 3}, owner="someone else") is None
    moved = _update(rt, run_id, again.version, {"round": 3}, new_messages=2, new_events=1)
    assert (moved.round, moved.msg_seq, moved.event_seq) == (
        3,
        again.msg_seq + 2,
        again.event_seq + 1,
    )
    # the same shape is one statement object
    shape = update_statement((("round", "value"), ("updated_at", "value")), False, ())
    assert shape is update_statement((("round", "value"), ("updated_at", "value")), False, ())


def test_a_claim_writes_its_round_started_event_and_only_once(rt: Runtime) -> None:
    run_id = submit(rt, agent([{"text": "hi"}]))
    with rt.engine.connect() as conn:
        run = run_store.load_run(conn, run_id)
    assert run is not None
    now = time.time()
    with rt.engine.begin() as conn:
        claimed = rt.store.claim_round(conn, run_id, run.version, "w1", now, now - 30)
        stale = rt.store.claim_round(conn, run_id, run.version + 5, "w2", now, now - 30)
    assert claimed is not None and stale is None
    new, abandoned, pre = claimed.run, claimed.abandoned, claimed.prefetched
    assert new.lease_owner == "w1" and not abandoned and new.event_seq == run.event_seq + 1
    with rt.engine.connect() as conn:
        rows = conn.execute(
            sa.select(events.c.seq, events.c.type, events.c.data).where(
                events.c.run_id == run_id, events.c.type == ROUND_STARTED
            )
        ).all()
    assert [(r.seq, r.data) for r in rows] == [(new.event_seq, {"round": 1})]
    assert round_started(new) == {"round": 1}
    assert pre is None  # not cold: nothing read beside the claim


def test_a_cold_claim_reads_the_spec_and_the_messages_in_its_own_statement(rt: Runtime) -> None:
    spec = agent([{"text": "hi"}], system_prompt="Be brief.")
    run_id = submit(rt, spec, text="hello there")
    with rt.engine.connect() as conn:
        run = run_store.load_run(conn, run_id)
        assert run is not None
        stored = records.own_messages(conn, run_id, run.view_start)
    now = time.time()
    with rt.engine.begin() as conn:
        claimed = rt.store.claim_round(conn, run_id, run.version, "w1", now, now - 30, cold=True)
    assert claimed is not None
    new, pre = claimed.run, claimed.prefetched
    if rt.engine.dialect.name != "postgresql":
        assert pre is None  # SQLite: the caches read them (one writer, no round trip)
        return
    assert pre is not None and pre.messages is not None
    assert pre.agent["system_prompt"] == "Be brief."
    assert [r["seq"] for r in pre.messages] == [r["seq"] for r in stored]
    assert [lineage.message_from_row(r) for r in pre.messages] == [
        lineage.message_from_row(r) for r in stored
    ]
    assert pre.messages[-1]["seq"] == new.msg_seq


def test_an_answer_reads_the_run_and_its_asks_round_in_one_read(rt: Runtime) -> None:
    ask = {"question": "Which?", "options": ["x", "y"]}
    spec = agent(
        [
            {
                "tool_calls": [
                    {"id": "e1", "name": "echo", "arguments": {"text": "one"}},
                    {"id": "a1", "name": "ask_user", "arguments": ask},
                ]
            },
            {"text": "ok"},
        ],
        ask=True,
        tools=["echo"],
    )
    other = submit(rt, spec)  # the same call ids in another run
    run_id = submit(rt, spec)
    rt.publish.drain(rt)  # type: ignore[attr-defined]
    with rt.engine.connect() as conn:
        found = rt.store.run_and_round(conn, run_id, "default", "a1")
        assert rt.store.run_and_round(conn, other, "default", "a1") is not None
        record = run_store.get_run(conn, run_id, "default")
        calls = call_store.round_of_call(conn, run_id, "a1")
        assert rt.store.run_and_round(conn, run_id, "someone else", "a1") is None
        assert rt.store.run_and_round(conn, run_id, None, "nope") == (record, [])
    assert found is not None and record is not None
    assert found == (record, calls)
    assert [c.call_id for c in calls] == ["e1", "a1"]
    assert record.status.value == "waiting"


def test_a_write_whose_new_call_id_is_taken_fails_naming_tool_calls(rt: Runtime) -> None:
    """The round's commit tells a reply reusing a stored call id (the model view no longer
    shows it) by the database's refusal naming ``tool_calls`` (``round._IdTaken``): the one
    statement of a write must keep saying so, and write nothing."""
    run_id = submit(rt, agent([{"text": "hi"}]))
    with rt.engine.connect() as conn:
        run = run_store.load_run(conn, run_id)
    assert run is not None
    row = {
        "run_id": run_id,
        "call_id": "c1",
        "round": 1,
        "idx": 0,
        "name": "echo",
        "arguments": "{}",
        "read_only": True,
        "status": "done",
    }
    beside = rows_beside(run_id, time.time(), events=[("x.y", {})], calls=[row])
    first = _update(rt, run_id, run.version, {"round": 1}, new_events=1, beside=beside)
    assert first is not None
    with pytest.raises(sa.exc.IntegrityError) as refused:
        _update(rt, run_id, first.version, {"round": 2}, new_events=1, beside=beside)
    assert "tool_calls" in str(refused.value.orig)
    with rt.engine.connect() as conn:
        after = run_store.load_run(conn, run_id)
        n = conn.execute(
            sa.select(sa.func.count()).where(events.c.run_id == run_id, events.c.type == "x.y")
        ).scalar_one()
    assert after is not None and after.version == first.version and n == 1
