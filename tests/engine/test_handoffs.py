"""Handoffs (docs/handoffs.md), through the fake OpenAI-compatible server over HTTP: a triage
agent hands the run to a billing agent; from the next round the billing agent's prompt,
tools and approvals apply, the transcript goes on unbroken, the handoff is in the loop
state and the events; a fork before the handoff replays it, one after starts with billing."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import sqlalchemy as sa

from shared.agent.spec import AgentSpec, ModelProfile
from shared.engine import commands, lifecycle
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.llm.fake_server import FakeLLMServer, ReplySpec
from shared.store.tables import events
from tests.engine.helpers import run, submit, transcript

ME = lifecycle.Actor("default", "key_test")
TRIAGE = "You are the triage agent."
BILLING = "You are the billing agent."


def support_model(body: dict[str, Any]) -> ReplySpec:
    """Triage transfers to billing; billing proposes a refund (a write), then answers."""
    system = body["messages"][0]["content"] if body["messages"][0]["role"] == "system" else ""
    if TRIAGE in system:
        return ReplySpec(tool_calls=[{"id": "t1", "name": "transfer_to_billing", "arguments": {}}])
    if any(m["role"] == "tool" and m.get("tool_call_id") == "w1" for m in body["messages"]):
        return ReplySpec(text="Your refund is on its way.")
    return ReplySpec(
        tool_calls=[{"id": "w1", "name": "write_thing", "arguments": {"item": "refund 42"}}]
    )


def support_spec(input_filter: str = "none", model: str = "main") -> AgentSpec:
    billing = {
        "kind": "agent",
        "model": model,
        "system_prompt": BILLING,
        "tools": ["write_thing"],
        "guarded": True,
    }
    return AgentSpec.model_validate(
        {
            "kind": "agent",
            "model": model,
            "system_prompt": TRIAGE,
            "tools": ["echo"],
            "handoffs": [
                {
                    "name": "billing",
                    "description": "Refunds and invoices.",
                    "agent": billing,
                    "input_filter": input_filter,
                }
            ],
        }
    )


def _rt(sqlite_rt: Runtime, url: str) -> Runtime:
    body = {"name": "main", "provider": "openai", "base_url": url, "model": "m"}
    return replace(sqlite_rt, profiles={"main": ModelProfile.model_validate(body).as_operator()})


def handoff_events(rt: Runtime, run_id: str) -> list[dict[str, Any]]:
    with rt.engine.connect() as conn:
        q = sa.select(events.c.data).where(
            events.c.run_id == run_id, events.c.type == "run.handoff"
        )
        return [dict(d) for d in conn.execute(q.order_by(events.c.seq)).scalars()]


def _tools(body: dict[str, Any]) -> set[str]:
    return {t["function"]["name"] for t in body.get("tools") or ()}


def _approve(rt: Runtime, stub: StubBroker, run_id: str) -> Any:
    waiting = run(rt, run_id)
    assert waiting["status"] == "waiting", waiting
    pending = waiting["pending"]
    assert pending["kind"] == "approval" and pending["items"][0]["tool"] == "write_thing"
    commands.approve_run(rt, None, run_id, pending["approval_id"], approve="all")
    stub.drain(rt)
    return run(rt, run_id)


def test_triage_hands_off_to_billing_whose_write_needs_approval(
    stub: StubBroker, sqlite_rt: Runtime
) -> None:
    with FakeLLMServer() as llm:
        llm.responder = support_model
        rt = _rt(sqlite_rt, llm.base_url)
        run_id = submit(rt, support_spec(), "I was charged twice")
        stub.drain(rt)
        done = _approve(rt, stub, run_id)
        bodies = llm.bodies
    assert done["status"] == "completed" and done["result"]["text"] == "Your refund is on its way."
    triage, billing = bodies[0], bodies[1]
    assert "transfer_to_billing" in _tools(triage) and "write_thing" not in _tools(triage)
    assert "write_thing" in _tools(billing) and "transfer_to_billing" not in _tools(billing)
    assert BILLING in billing["messages"][0]["content"]
    roles = [(m["role"], m.get("tool_call_id")) for m in billing["messages"][1:]]
    assert roles == [("user", None), ("assistant", None), ("tool", "t1")]  # continuous
    assert [r for r, _, _ in transcript(rt, run_id)] == [
        "user", "assistant", "tool", "assistant", "tool", "assistant"
    ]  # fmt: skip
    (moved,) = handoff_events(rt, run_id)
    assert moved == {"round": 1, "from": None, "to": "billing", "path": ["billing"]}
    assert done["loop"]["handoffs"] == ["billing"]


def test_drop_tools_hides_tool_traffic_from_the_new_agent(
    stub: StubBroker, sqlite_rt: Runtime
) -> None:
    with FakeLLMServer() as llm:
        llm.responder = support_model
        rt = _rt(sqlite_rt, llm.base_url)
        run_id = submit(rt, support_spec("drop_tools"), "I was charged twice")
        stub.drain(rt)
        done = _approve(rt, stub, run_id)
        billing, last = llm.bodies[1], llm.bodies[-1]
    assert done["result"]["text"] == "Your refund is on its way."
    assert [m["role"] for m in billing["messages"]] == ["system", "user"]
    # billing's own tool traffic, after the handoff, is kept
    assert [m["role"] for m in last["messages"]] == ["system", "user", "assistant", "tool"]
    assert len(transcript(rt, run_id)) == 6  # the transcript itself keeps everything


def test_a_fork_before_the_handoff_replays_it_and_one_after_keeps_it(
    stub: StubBroker, sqlite_rt: Runtime
) -> None:
    with FakeLLMServer() as llm:
        llm.responder = support_model
        rt = _rt(sqlite_rt, llm.base_url)
        source = submit(rt, support_spec(), "I was charged twice")
        stub.drain(rt)
        _approve(rt, stub, source)
        before = lifecycle.fork_run(rt, ME, source, lifecycle.ForkInput(0))["id"]
        after = lifecycle.fork_run(rt, ME, source, lifecycle.ForkInput(1))["id"]
        stub.drain(rt)
    assert run(rt, before)["loop"]["handoffs"] == ["billing"]  # taken again
    assert [e["round"] for e in handoff_events(rt, before)] == [1]
    assert run(rt, after)["status"] == "waiting"  # billing's write waits for approval
    (inherited,) = handoff_events(rt, after)
    assert inherited["inherited"] and inherited["path"] == ["billing"]
