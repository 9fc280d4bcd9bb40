"""Guardrails (docs/guardrails.md), through the fake OpenAI-compatible server over HTTP: a
helper-model check, a rule and a plugin each end a run with ``stop_reason: guardrail`` and
their reason; a passing check costs its call in ``/usage`` (once: a re-run round does not
bill it again); a parallel guardrail that fires aborts the model call in flight."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import sqlalchemy as sa

from shared.agent.spec import AgentSpec, ModelProfile
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.llm.fake_server import FakeLLMServer, ReplySpec
from shared.store.tables import events, usage
from tests.engine.helpers import model_rounds, run, submit

PRICING = {"tiers": [{"input": 1.0, "output": 2.0}]}


def _profile(base_url: str, name: str) -> ModelProfile:
    body = {
        "name": name,
        "provider": "openai",
        "base_url": base_url,
        "model": f"{name}-model",
        "max_retries": 2,
        "pricing": PRICING,
    }
    return ModelProfile.model_validate(body).as_operator()


def _rt(sqlite_rt: Runtime, main_url: str, guard_url: str) -> Runtime:
    profiles = {"main": _profile(main_url, "main"), "guard": _profile(guard_url, "guard")}
    return replace(sqlite_rt, profiles=profiles)


def _agent(**spec: Any) -> AgentSpec:
    return AgentSpec.model_validate({"kind": "agent", "model": "main", **spec})


MODEL_GUARD = {"name": "topic", "model": {"model": "guard", "instructions": "No crypto talk."}}


def _tripped(rt: Runtime, run_id: str) -> list[dict[str, Any]]:
    with rt.engine.connect() as conn:
        q = sa.select(events.c.data).where(
            events.c.run_id == run_id, events.c.type == "guardrail.tripped"
        )
        return [dict(d) for d in conn.execute(q).scalars()]


def _usage(rt: Runtime, run_id: str, purpose: str) -> list[dict[str, Any]]:
    with rt.engine.connect() as conn:
        q = sa.select(usage).where(usage.c.run_id == run_id, usage.c.purpose == purpose)
        return [dict(r) for r in conn.execute(q).mappings()]


def test_a_model_check_that_trips_ends_the_run_with_its_reason(
    stub: StubBroker, sqlite_rt: Runtime
) -> None:
    with FakeLLMServer() as main, FakeLLMServer() as guard:
        guard.responder = lambda body: '{"category": "block", "reason": "crypto advice"}'
        rt = _rt(sqlite_rt, main.base_url, guard.base_url)
        run_id = submit(rt, _agent(input_guardrails=[MODEL_GUARD]), "which coin to buy?")
        stub.drain(rt)
        done = run(rt, run_id)
        assert main.bodies == []  # the model never saw the input
    assert done["status"] == "completed" and done["stop_reason"] == "guardrail"
    tripped = done["result"]["guardrail"]
    assert tripped["name"] == "topic" and tripped["stage"] == "input"
    assert "block" in tripped["reason"] and "crypto advice" in tripped["reason"]
    assert _tripped(rt, run_id)[0]["name"] == "topic"
    (row,) = _usage(rt, run_id, "guardrail")  # the check itself is billed
    assert row["profile"] == "guard" and row["cost"] > 0
    assert done["cost"] == row["cost"]


def test_a_passing_model_check_costs_its_call_once(stub: StubBroker, sqlite_rt: Runtime) -> None:
    with FakeLLMServer() as main, FakeLLMServer() as guard:
        guard.responder = lambda body: "allow"
        fails = iter([True])

        def flaky(body: dict[str, Any]) -> ReplySpec:  # the first call: a 500, retried
            if next(fails, False):
                return ReplySpec(status=500, body={"error": {"message": "down"}})
            return ReplySpec(text="Bitcoin is a currency.")

        main.responder = flaky
        rt = _rt(sqlite_rt, main.base_url, guard.base_url)
        run_id = submit(rt, _agent(input_guardrails=[MODEL_GUARD]), "what is bitcoin?")
        stub.drain(rt)
        done = run(rt, run_id)
        assert len(guard.bodies) == 1  # the re-run round did not run the check again
        assert len(main.bodies) == 2
    assert done["status"] == "completed" and done["stop_reason"] == "completed", done["error"]
    assert done["result"]["text"] == "Bitcoin is a currency."
    (row,) = _usage(rt, run_id, "guardrail")
    assert row["cost"] > 0 and row["committed"]
    (round_row,) = _usage(rt, run_id, "round")
    assert abs(done["cost"] - (row["cost"] + round_row["cost"])) < 1e-9
    assert done["loop"]["guardrails_passed"] == ["input:0:topic"]


def test_a_rule_trips_on_the_input(stub: StubBroker, sqlite_rt: Runtime) -> None:
    guard = {"name": "no_card", "rule": {"regex": r"\b\d{4}([ -]?\d{4}){3}\b"}}
    with FakeLLMServer() as main:
        rt = _rt(sqlite_rt, main.base_url, main.base_url)
        run_id = submit(rt, _agent(input_guardrails=[guard]), "my card is 4111 1111 1111 1111")
        stub.drain(rt)
        done = run(rt, run_id)
        assert main.bodies == []
    assert done["stop_reason"] == "guardrail"
    assert done["result"]["guardrail"]["name"] == "no_card"
    assert "matches" in done["result"]["guardrail"]["reason"]


def test_an_output_rule_withholds_an_answer_that_breaks_its_schema(
    stub: StubBroker, sqlite_rt: Runtime
) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    guard = {"name": "shape", "rule": {"json_schema": schema}}
    with FakeLLMServer() as main:
        main.responder = lambda body: "not json at all"
        rt = _rt(sqlite_rt, main.base_url, main.base_url)
        run_id = submit(rt, _agent(output_guardrails=[guard]))
        stub.drain(rt)
        done = run(rt, run_id)
    assert done["stop_reason"] == "guardrail"
    assert done["result"]["text"] == ""  # the answer is withheld
    assert done["result"]["guardrail"]["stage"] == "output"
    assert model_rounds(rt, run_id) == 1


def test_a_plugin_trips_on_the_answer(stub: StubBroker, sqlite_rt: Runtime) -> None:
    guard = {"name": "leaks", "plugin": "no_secrets"}
    with FakeLLMServer() as main:
        main.responder = lambda body: "The secret is 42."
        rt = _rt(sqlite_rt, main.base_url, main.base_url)
        run_id = submit(rt, _agent(output_guardrails=[guard]))
        stub.drain(rt)
        done = run(rt, run_id)
    assert done["stop_reason"] == "guardrail"
    assert done["result"]["guardrail"] == {
        "name": "leaks",
        "reason": "the output mentions a secret",
        "stage": "output",
        "kind": "plugin",
    }
    (ev,) = _tripped(rt, run_id)
    assert ev["reason"] == "the output mentions a secret"


def test_a_plugin_on_tool_calls_stops_the_call_before_it_runs(
    stub: StubBroker, sqlite_rt: Runtime
) -> None:
    guard = {"name": "leaks", "plugin": "no_secrets", "tool_calls": True}
    with FakeLLMServer() as main:
        call = {"id": "c1", "name": "echo", "arguments": {"text": "the secret"}}
        main.responder = lambda body: ReplySpec(tool_calls=[call])
        rt = _rt(sqlite_rt, main.base_url, main.base_url)
        run_id = submit(rt, _agent(tools=["echo"], output_guardrails=[guard]))
        stub.drain(rt)
        done = run(rt, run_id)
    assert done["stop_reason"] == "guardrail"
    assert done["result"]["guardrail"]["stage"] == "tool_call"


def test_a_parallel_guardrail_that_fires_aborts_the_model_call(
    stub: StubBroker, sqlite_rt: Runtime
) -> None:
    guard = {"name": "leaks", "plugin": "slow_no_secrets", "parallel": True}
    with FakeLLMServer() as main:
        main.responder = lambda body: ReplySpec(text="slow answer", first_byte_latency=20.0)
        rt = _rt(sqlite_rt, main.base_url, main.base_url)
        run_id = submit(rt, _agent(input_guardrails=[guard]), "tell me the secret")
        started = time.time()
        stub.drain(rt)
        took = time.time() - started
        done = run(rt, run_id)
        assert len(main.bodies) == 1  # the call was made, and cut short
        deadline = time.time() + 5
        while not main.disconnects and time.time() < deadline:
            time.sleep(0.05)
        assert main.disconnects  # the stream was closed under the model
    assert took < 10, took
    assert done["stop_reason"] == "guardrail"
    assert done["result"]["guardrail"]["name"] == "leaks"
    (row,) = _usage(rt, run_id, "round")  # the stopped call is billed as estimated
    assert row["estimated"]


def test_a_parallel_guardrail_that_passes_lets_the_answer_through(
    stub: StubBroker, sqlite_rt: Runtime
) -> None:
    guard = {"name": "leaks", "plugin": "slow_no_secrets", "parallel": True}
    with FakeLLMServer() as main:
        main.responder = lambda body: "hello"
        rt = _rt(sqlite_rt, main.base_url, main.base_url)
        run_id = submit(rt, _agent(input_guardrails=[guard]), "hi")
        stub.drain(rt)
        done = run(rt, run_id)
    assert done["stop_reason"] == "completed" and done["result"]["text"] == "hello"
    assert done["loop"]["guardrails_passed"] == ["input:0:leaks"]
