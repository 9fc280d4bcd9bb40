"""What can be checked of a spec before it runs is checked at submit (L-12): a 422 that names
the field, and nothing written — instead of a run that fails (and bills) every round."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

DANGLING = {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}
BAD_SPECS = {
    "dangling $ref": ({"output_schema": DANGLING}, "points at nothing"),
    "unknown handler": ({"router": [{"any": ["x"], "handler": "nope"}]}, "unknown handler"),
    "unknown tool": ({"tools": ["no_such_tool"]}, "unknown tool"),
    "unknown guardrail plugin": (
        {"input_guardrails": [{"name": "g", "plugin": "nope"}]},
        "unknown guardrail plugin",
    ),
    "guardrail regex": (
        {"input_guardrails": [{"name": "g", "rule": {"regex": "(unclosed"}}]},
        "regex does not compile",
    ),
    "guardrail regex that backtracks": (
        {"input_guardrails": [{"name": "g", "rule": {"regex": "(a+)+$"}}]},
        "a repeat of a repeat",
    ),
    "guardrail of two kinds": (
        {"output_guardrails": [{"name": "g", "plugin": "no_secrets", "rule": {"regex": "x"}}]},
        "exactly one of",
    ),
    "parallel output guardrail": (
        {"output_guardrails": [{"name": "g", "plugin": "no_secrets", "parallel": True}]},
        "`parallel` is for input guardrails",
    ),
    "guardrail that never trips": (
        {
            "input_guardrails": [
                {"name": "g", "model": {"categories": [{"key": "a"}, {"key": "b"}]}}
            ]
        },
        "trip: true",
    ),
}


def _spec(extra: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "agent", "model": "demo", **extra}


@pytest.mark.parametrize("case", sorted(BAD_SPECS))
def test_a_spec_that_cannot_run_is_refused_at_submit(client: TestClient, case: str) -> None:
    extra, says = BAD_SPECS[case]
    r = client.post("/v1/runs", json={"agent": _spec(extra), "input": "hi"})
    assert r.status_code == 422, r.text
    assert says in r.text
    assert client.get("/v1/runs").json()["runs"] == []  # nothing written


@pytest.mark.parametrize("case", sorted(BAD_SPECS))
def test_a_saved_agent_that_cannot_run_is_refused(client: TestClient, case: str) -> None:
    extra, says = BAD_SPECS[case]
    r = client.post("/v1/agents", json={"name": "broken", "spec": _spec(extra)})
    assert r.status_code == 422, r.text
    assert says in r.text
    assert client.get("/v1/agents/broken").status_code == 404


def test_max_attempts_is_bounded(client: TestClient) -> None:
    r = client.post("/v1/runs", json={"agent": _spec({"max_attempts": 21}), "input": "hi"})
    assert r.status_code == 422 and "max_attempts" in r.text
