"""Planning agent: plans, ask pauses that hold nothing, answers that resume (SPEC P-*, A-*)."""

from __future__ import annotations

import time

import pytest

from shared.engine import commands
from shared.engine.reaper import reap
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.errors import Conflict
from shared.store import records
from tests.engine.helpers import agent, call, due_work, model_rounds, run, submit, transcript

ASK = {
    "reason": "Need the city",
    "questions": [
        {
            "question": "Which city?",
            "options": [{"label": "Paris", "value": "paris"}, {"label": "Rome", "value": "rome"}],
        }
    ],
}


def _plan_ask_spec(**kw: object):  # type: ignore[no-untyped-def]
    return agent(
        [
            {
                "tool_calls": [
                    call("set_plan", {"name": "Trip", "steps": ["pick city", "book"]}, "p1"),
                    call("ask_user", ASK, "ask1"),
                    call("echo", {"text": "never"}, "e1"),
                ]
            },
            {
                "tool_calls": [
                    call(
                        "update_plan",
                        {"updates": [{"id": "s1", "status": "done", "note": "paris"}]},
                        "p2",
                    )
                ]
            },
            {"text": "Booked Paris."},
        ],
        tools=["echo"],
        plan=True,
        ask=True,
        **kw,
    )


def test_plan_then_ask_waits_holding_nothing(sqlite_rt: Runtime, stub: StubBroker) -> None:
    # SPEC A-2, P-1, L-4 (skipped after a pause), D-3 (nothing queued)
    run_id = submit(sqlite_rt, _plan_ask_spec())
    stub.drain(sqlite_rt)
    r = run(sqlite_rt, run_id)
    assert r["status"] == "waiting"
    assert r["pending"]["kind"] == "ask" and r["pending"]["ask_id"] == "ask1"
    assert r["pending"]["questions"][0]["question"] == "Which city?"
    assert r["plan"]["name"] == "Trip" and [s["id"] for s in r["plan"]["steps"]] == ["s1", "s2"]
    assert due_work(sqlite_rt, run_id) == 0 and not stub.queue
    tools = [x for x in transcript(sqlite_rt, run_id) if x[0] == "tool"]
    assert len(tools) == 1 and "s1: pick city" in tools[0][1]  # the ask's message comes later


def test_answer_resumes_the_same_chain(sqlite_rt: Runtime, stub: StubBroker) -> None:
    # SPEC A-3: rendered answer is the ask's tool message; skipped calls follow in call order
    run_id = submit(sqlite_rt, _plan_ask_spec())
    stub.drain(sqlite_rt)
    commands.answer_run(sqlite_rt, "default", run_id, "ask1", ["paris"])
    assert run(sqlite_rt, run_id)["status"] == "running"
    stub.drain(sqlite_rt)
    r = run(sqlite_rt, run_id)
    assert (r["status"], r["result"]["text"]) == ("completed", "Booked Paris.")
    assert r["plan"]["steps"][0]["status"] == "done" and r["plan"]["steps"][0]["note"] == "paris"
    tools = [x[1] for x in transcript(sqlite_rt, run_id) if x[0] == "tool"]
    assert tools[1] == "## Which city?\nAnswer: Paris - paris"
    assert tools[2].startswith("Skipped")
    assert model_rounds(sqlite_rt, run_id) == 3


def test_double_answer_is_idempotent_wrong_or_late_is_conflict(
    sqlite_rt: Runtime, stub: StubBroker
) -> None:
    run_id = submit(sqlite_rt, _plan_ask_spec())
    stub.drain(sqlite_rt)
    with pytest.raises(Conflict):
        commands.answer_run(sqlite_rt, "default", run_id, "not-the-ask", ["x"])
    commands.answer_run(sqlite_rt, "default", run_id, "ask1", ["rome"])
    again = commands.answer_run(sqlite_rt, "default", run_id, "ask1", ["rome"])
    assert again["id"] == run_id
    with pytest.raises(Conflict):
        commands.answer_run(sqlite_rt, "default", run_id, "ask1", ["paris"])  # a different one
    stub.drain(sqlite_rt)
    assert run(sqlite_rt, run_id)["status"] == "completed"
    with pytest.raises(Conflict):
        commands.answer_run(sqlite_rt, "default", run_id, "ask2", ["x"])


def test_several_asks_in_one_run(sqlite_rt: Runtime, stub: StubBroker) -> None:
    spec = agent(
        [
            {"tool_calls": [call("ask_user", {"question": "A?", "options": ["x", "y"]}, "a1")]},
            {"tool_calls": [call("ask_user", {"question": "B?", "options": ["u", "v"]}, "a2")]},
            {"text": "thanks"},
        ],
        ask=True,
    )
    run_id = submit(sqlite_rt, spec)
    stub.drain(sqlite_rt)
    commands.answer_run(sqlite_rt, "default", run_id, "a1", ["x"])
    stub.drain(sqlite_rt)
    assert run(sqlite_rt, run_id)["pending"]["ask_id"] == "a2"
    commands.answer_run(sqlite_rt, "default", run_id, "a2", ["v"])
    stub.drain(sqlite_rt)
    r = run(sqlite_rt, run_id)
    assert r["status"] == "completed"
    tools = [x[1] for x in transcript(sqlite_rt, run_id) if x[0] == "tool"]
    assert tools == ["## A?\nAnswer: x", "## B?\nAnswer: v"]


def test_invalid_ask_goes_back_to_the_model(sqlite_rt: Runtime, stub: StubBroker) -> None:
    # SPEC A-1: invalid arguments → the error is the tool result and the loop continues
    spec = agent(
        [{"tool_calls": [call("ask_user", {"questions": []}, "bad")]}, {"text": "ok"}], ask=True
    )
    run_id = submit(sqlite_rt, spec)
    stub.drain(sqlite_rt)
    r = run(sqlite_rt, run_id)
    assert r["status"] == "completed"
    assert [x for x in transcript(sqlite_rt, run_id) if x[0] == "tool"][0][1]


@pytest.mark.parametrize("action", ["answer", "fail"])
def test_expired_ask_handled_per_config(sqlite_rt: Runtime, stub: StubBroker, action: str) -> None:
    # SPEC A-4
    spec = agent(
        [
            {"tool_calls": [call("ask_user", {"question": "A?", "options": ["x", "y"]}, "a1")]},
            {"text": "went on"},
        ],
        ask=True,
        ask_timeout_s=0.2,
        ask_timeout_action=action,
    )
    run_id = submit(sqlite_rt, spec)
    stub.drain(sqlite_rt)
    time.sleep(0.3)
    assert reap(sqlite_rt).expired_asks == 1
    stub.drain(sqlite_rt)
    r = run(sqlite_rt, run_id)
    if action == "answer":
        assert r["status"] == "completed"
        tools = [x[1] for x in transcript(sqlite_rt, run_id) if x[0] == "tool"]
        assert tools == ["(no answer: timed out)"]
    else:
        assert r["status"] == "failed" and r["stop_reason"] == "ask_timeout"


def test_plan_is_part_of_every_checkpoint(sqlite_rt: Runtime, stub: StubBroker) -> None:
    # SPEC P-4: the plan is stored with the round's commit and shown in the API
    run_id = submit(sqlite_rt, _plan_ask_spec())
    stub.drain(sqlite_rt)
    with sqlite_rt.engine.connect() as conn:
        evs = [e["type"] for e in records.list_events(conn, run_id)]
    assert "plan.updated" in evs


def test_atomic_update_failure_keeps_the_plan(sqlite_rt: Runtime, stub: StubBroker) -> None:
    # SPEC P-3 through a run
    spec = agent(
        [
            {"tool_calls": [call("set_plan", {"name": "P", "steps": ["a", "b"]})]},
            {
                "tool_calls": [
                    call(
                        "update_plan",
                        {
                            "updates": [
                                {"id": "s1", "status": "done"},
                                {"id": "zz", "status": "done"},
                            ],
                            "add_steps": ["c"],
                        },
                    )
                ]
            },
            {"text": "ok"},
        ],
        plan=True,
    )
    run_id = submit(sqlite_rt, spec)
    stub.drain(sqlite_rt)
    r = run(sqlite_rt, run_id)
    assert [s["status"] for s in r["plan"]["steps"]] == ["pending", "pending"]
    tools = [x[1] for x in transcript(sqlite_rt, run_id) if x[0] == "tool"]
    assert tools[1] == "Unknown plan step: zz"
