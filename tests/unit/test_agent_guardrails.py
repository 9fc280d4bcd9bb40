"""The pure guardrail decisions (shared.agent.guardrails): rules, the model check's verdict,
which input guardrails are still to run."""

from __future__ import annotations

from shared.agent.guardrails import (
    Trip,
    check_messages,
    check_rule,
    model_verdict,
    pending_input,
    tripped_finish,
    with_passed,
)
from shared.agent.spec import AgentSpec, GuardrailModelCheck, GuardrailRule, regex_window
from shared.agent.state import LoopState


def test_a_regex_rule_trips_on_a_match_or_on_none() -> None:
    assert check_rule(GuardrailRule(regex="secret"), "a secret") is not None
    assert check_rule(GuardrailRule(regex="secret"), "nothing") is None
    must = GuardrailRule(regex="^OK", trip_when="no_match")
    assert check_rule(must, "OK fine") is None and check_rule(must, "no") is not None
    assert check_rule(GuardrailRule(regex="SECRET", ignore_case=True), "secret") is not None


def test_a_schema_rule_wants_a_valid_object() -> None:
    rule = GuardrailRule(json_schema={"type": "object", "required": ["ok"]})
    assert check_rule(rule, '{"ok": 1}') is None
    assert check_rule(rule, "{}") is not None and check_rule(rule, "prose") is not None


def test_the_model_check_reads_a_classify_reply() -> None:
    check = GuardrailModelCheck(instructions="No crypto.")
    msgs = check_messages(check, "buy coins?")
    assert "No crypto." in msgs[0].text and msgs[-1].text == "buy coins?"
    assert model_verdict(check, "allow") is None
    assert model_verdict(check, '{"category": "block", "reason": "coins"}') == (
        "classified as block: coins"
    )


def test_input_guardrails_run_before_the_first_call_and_once() -> None:
    spec = AgentSpec.model_validate(
        {
            "input_guardrails": [
                {"name": "a", "plugin": "p"},
                {"name": "b", "plugin": "p", "parallel": True},
            ]
        }
    )
    state = LoopState()
    assert [g.name for g in pending_input(spec, state, parallel=False)] == ["a"]
    assert [g.name for g in pending_input(spec, state, parallel=True)] == ["b"]
    passed = with_passed(state, spec, [spec.input_guardrails[0]])
    assert pending_input(spec, passed, parallel=False) == []
    assert LoopState.from_dict(passed.to_dict()).guardrails_passed == ("input:0:a",)
    assert pending_input(spec, LoopState(round=1), parallel=True) == []


def test_a_tripwire_ends_the_run_without_the_answer() -> None:
    finish = tripped_finish(Trip("g", "why", "output", "rule"))
    assert finish.stop_reason == "guardrail" and finish.text == ""
    assert finish.result["guardrail"]["reason"] == "why"


def test_a_rule_regex_that_could_backtrack_without_bound_is_refused() -> None:
    import pytest
    from pydantic import ValidationError

    for risky in (r"(a+)+$", r"(a|ab)*c", r"(\w)\1", r"(?=x)y", r"(a?){50}"):
        with pytest.raises(ValidationError):
            GuardrailRule(regex=risky)
    for fine in (r"\b\d{4}([ -]?\d{4}){3}\b", r"secret", r"^OK.*$", r"[ab]+c", r"\d*\d*x"):
        GuardrailRule(regex=fine)
    # more unbounded repeats: the search sees less of the text, so it stays cheap
    assert regex_window("secret") == 100_000 and regex_window(r"\d*x") == 10_000
    assert regex_window(r"\d*\d*x") < 500
