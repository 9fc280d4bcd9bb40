"""A 422 names each invalid field as the client sent it (``agent.output_schema``,
``input.0.content``, ``limit``), never pydantic's own steps (``function-after[_kind_needs(), …]``,
``constrained-str``, ``list[InputMessage]``), and leaves out the other union members' type
mismatches (``agent`` is not a string: the object sent is what is wrong)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from scheduler.http.errors import client_path, field_errors

PYDANTIC_STEPS = ("[", "(", "function-", "constrained-", "InputMessage", "AgentSpec")


def _details(response: Any) -> list[dict[str, Any]]:
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    named = [error["message"].split(": ", 1)[0], *(d["path"] for d in error["details"])]
    assert not [n for n in named if any(step in n for step in PYDANTIC_STEPS)], error
    assert error["message"].startswith(f"{error['details'][0]['path']}: ")
    return list(error["details"])


@pytest.mark.parametrize(
    ("body", "paths"),
    [
        ({"agent": {"model": "demo", "output_schema": {"type": 5}}}, {"agent.output_schema"}),
        ({"agent": {"model": "demo", "output_schema": 3}}, {"agent.output_schema"}),
        ({"agent": {"model": "demo", "bogus": 1}}, {"agent.bogus"}),
        ({"agent": {"model": "demo", "max_rounds": 0}}, {"agent.max_rounds"}),
        (
            {"agent": {"model": "demo", "tools": [{"name": "x", "http": {"url": 5}}]}},
            {"agent.tools.0.http.url"},
        ),
        ({"agent": "demo", "input": [{"role": "user", "content": 5}]}, {"input.0.content"}),
        ({"agent": "demo", "round": "a"}, {"round"}),
        ({"input": "x"}, {"agent"}),
    ],
)
def test_a_body_error_names_the_field_sent(
    client: TestClient, body: dict[str, Any], paths: set[str]
) -> None:
    sent = {"input": "hi", **body}
    assert {d["path"] for d in _details(client.post("/v1/runs", json=sent))} == paths


def test_a_query_error_names_the_parameter(client: TestClient) -> None:
    details = _details(client.get("/v1/runs?limit=abc&status=nope"))
    # status repeats (?status=a&status=b): the path names which one
    assert {d["path"] for d in details} == {"limit", "status.0"}


def test_an_assistant_context_error_names_context(client: TestClient) -> None:
    body = {"graph_id": "demo", "context": {"max_rounds": "x"}}
    [detail] = _details(client.post("/langgraph/assistants", json=body))
    assert detail["path"] == "context.max_rounds"
    body = {"graph_id": "demo", "config": {"configurable": {"max_rounds": "x"}}}
    [detail] = _details(client.post("/langgraph/assistants", json=body))
    assert detail["path"] == "config.configurable.max_rounds"


def test_the_openai_facade_names_the_param(client: TestClient) -> None:
    response = client.post("/openai/v1/responses", json={"model": "demo", "input": 5})
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == "input", error
    assert error["message"].startswith("input: ")


def test_client_path_reads_pydantic_steps() -> None:
    loc = ("body", "agent", "function-after[_kind_needs(), AgentSpec]", "tools", 0, "name")
    body = {"agent": {"tools": [{"name": 5}]}}
    assert client_path(loc, body) == "agent.tools.0.name"
    assert client_path(loc) == "agent.tools.0.name"  # no body: told apart by their shape
    missing = ("body", "agent", "AgentSpec", "model")
    assert client_path(missing, {"agent": {}}, missing=True) == "agent.model"
    assert client_path(("query", "limit")) == "limit"
    union = [
        {"loc": ("body", "agent", "constrained-str"), "msg": "not a string", "type": "string_type"},
        {"loc": ("body", "agent", "AgentSpec", "x"), "msg": "extra", "type": "extra_forbidden"},
    ]
    assert field_errors(union, {"agent": {"x": 1}}) == [
        {"path": "agent.x", "message": "extra", "type": "extra_forbidden"}
    ]
