"""The built-in demo agents on the offline demo model, through the engine (stub broker):
demo-planner plans and asks, a guarded demo agent asks and then proposes a write."""

from __future__ import annotations

from typing import Any

from scheduler.http.agents import resolve_agent
from shared.agent.spec import AgentSpec
from shared.engine import commands
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from tests.engine.helpers import run, submit, transcript


def _drain(rt: Runtime, stub: StubBroker, run_id: str) -> dict[str, Any]:
    stub.drain(rt)
    return dict(run(rt, run_id))


def test_demo_planner_plans_asks_and_finishes_the_plan(
    sqlite_rt: Runtime, stub: StubBroker
) -> None:
    run_id = submit(sqlite_rt, resolve_agent("demo-planner"), "Plan a trip")
    r = _drain(sqlite_rt, stub, run_id)
    assert r["status"] == "waiting" and r["pending"]["kind"] == "ask"
    assert r["plan"]["name"] == "Trip" and len(r["plan"]["steps"]) == 4
    assert r["pending"]["questions"][0]["question"] == "What kind of trip do you have in mind?"
    commands.answer_run(sqlite_rt, "default", run_id, r["pending"]["ask_id"], ["beach"])
    r = _drain(sqlite_rt, stub, run_id)
    assert r["status"] == "completed"
    assert {s["status"] for s in r["plan"]["steps"]} == {"done"}
    assert r["plan"]["steps"][0]["note"] == "Beach holiday"
    assert "You chose: Beach holiday." in r["result"]["text"]


def test_the_demo_model_asks_then_proposes_a_write_for_approval(
    sqlite_rt: Runtime, stub: StubBroker
) -> None:
    spec = AgentSpec.model_validate(
        {"kind": "agent", "model": "demo", "ask": True, "guarded": True, "tools": ["save_note"]}
    )
    run_id = submit(sqlite_rt, spec, "Please save a note")
    r = _drain(sqlite_rt, stub, run_id)
    assert r["pending"]["kind"] == "ask"
    commands.answer_run(sqlite_rt, "default", run_id, r["pending"]["ask_id"], ["reminder"])
    r = _drain(sqlite_rt, stub, run_id)
    assert r["status"] == "waiting" and r["pending"]["kind"] == "approval"
    [item] = r["pending"]["items"]
    assert item["tool"] == "save_note" and "Reminder for tomorrow" in item["arguments"]["text"]
    commands.approve_run(sqlite_rt, "default", run_id, r["pending"]["approval_id"], "all")
    r = _drain(sqlite_rt, stub, run_id)
    assert r["status"] == "completed" and "save_note: Saved note" in r["result"]["text"]


def test_the_demo_agent_still_uses_its_tools(sqlite_rt: Runtime, stub: StubBroker) -> None:
    run_id = submit(sqlite_rt, resolve_agent("demo"), "What is 17 * 23?")
    r = _drain(sqlite_rt, stub, run_id)
    assert r["status"] == "completed" and "calculator: 391" in r["result"]["text"]
    assert [t for t in transcript(sqlite_rt, run_id) if t[0] == "tool"] == [("tool", "391", [])]


def test_demo_planner_answers_a_direct_question_without_a_plan(
    sqlite_rt: Runtime, stub: StubBroker
) -> None:
    run_id = submit(sqlite_rt, resolve_agent("demo-planner"), "What is 2+3?")
    r = _drain(sqlite_rt, stub, run_id)
    assert r["status"] == "completed" and r["plan"] is None
    assert "calculator: 5" in r["result"]["text"]
