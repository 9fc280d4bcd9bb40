"""Structured final answers (``output_schema``): the data in ``result.data``, one repair round,
``output_invalid`` after it; ``response_format`` sent where the profile supports it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from scheduler.app import create_app
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.llm.fake_server import FakeLLMServer, ReplySpec
from tests.engine.helpers import agent, call, model_rounds, run, submit, transcript

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "temp_c": {"type": "number"}},
    "required": ["city", "temp_c"],
    "additionalProperties": False,
}


def test_valid_answer_becomes_result_data(sqlite_rt: Runtime, stub: StubBroker) -> None:
    spec = agent(
        [
            {"tool_calls": [call("echo", {"text": "Paris 21"}, "c1")]},
            {"text": '```json\n{"city": "Paris", "temp_c": 21}\n```'},
        ],
        tools=["echo"],
        output_schema=SCHEMA,
    )
    run_id = submit(sqlite_rt, spec)
    stub.drain(sqlite_rt)
    r = run(sqlite_rt, run_id)
    assert (r["status"], r["stop_reason"]) == ("completed", "completed")
    assert r["result"]["data"] == {"city": "Paris", "temp_c": 21}


def test_prose_gets_one_repair_round(sqlite_rt: Runtime, stub: StubBroker) -> None:
    spec = agent(
        [{"text": "It is 21 degrees in Paris."}, {"text": '{"city": "Paris", "temp_c": 21}'}],
        output_schema=SCHEMA,
    )
    run_id = submit(sqlite_rt, spec)
    stub.drain(sqlite_rt)
    r = run(sqlite_rt, run_id)
    assert (r["status"], r["stop_reason"]) == ("completed", "completed")
    assert r["result"]["data"] == {"city": "Paris", "temp_c": 21}
    roles = [m[0] for m in transcript(sqlite_rt, run_id)]
    assert roles == ["user", "assistant", "user", "assistant"]
    assert "does not match the required JSON Schema" in transcript(sqlite_rt, run_id)[2][1]
    assert model_rounds(sqlite_rt, run_id) == 2


def test_prose_twice_ends_output_invalid(sqlite_rt: Runtime, stub: StubBroker) -> None:
    spec = agent(
        [{"text": "Paris, warm."}, {"text": "Still prose: Paris is warm."}],
        output_schema=SCHEMA,
    )
    run_id = submit(sqlite_rt, spec)
    stub.drain(sqlite_rt)
    r = run(sqlite_rt, run_id)
    assert (r["status"], r["stop_reason"]) == ("completed", "output_invalid")
    assert r["result"]["text"] == "Still prose: Paris is warm."
    assert "data" not in r["result"]
    assert "not a JSON object" in r["result"]["output_error"]
    assert model_rounds(sqlite_rt, run_id) == 2


def test_schema_violation_is_named(sqlite_rt: Runtime, stub: StubBroker) -> None:
    spec = agent(
        [{"text": '{"city": "Paris", "temp_c": "warm"}'}, {"text": '{"city": "Paris"}'}],
        output_schema=SCHEMA,
    )
    run_id = submit(sqlite_rt, spec)
    stub.drain(sqlite_rt)
    r = run(sqlite_rt, run_id)
    assert r["stop_reason"] == "output_invalid"
    assert "temp_c" in transcript(sqlite_rt, run_id)[2][1]  # the repair prompt names it
    assert "'temp_c' is a required property" in r["result"]["output_error"]


@pytest.fixture
def llm() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as server:
        yield server


@pytest.mark.parametrize("json_schema", [True, False])
def test_response_format_where_supported(
    sqlite_rt: Runtime, stub: StubBroker, llm: FakeLLMServer, json_schema: bool
) -> None:
    llm.script(ReplySpec(text=json.dumps({"city": "Oslo", "temp_c": -3})))
    model = {"base_url": llm.base_url, "model": "fake-1", "json_schema": json_schema}
    body = {"kind": "agent", "model": model, "tools": ["calculator"], "output_schema": SCHEMA}
    with TestClient(create_app(lambda: sqlite_rt)) as client:
        created = client.post("/v1/runs", json={"agent": body, "input": "Oslo?"}).json()
        stub.drain(sqlite_rt)
        done = client.get(f"/v1/runs/{created['id']}").json()
    assert done["result"]["data"] == {"city": "Oslo", "temp_c": -3}
    sent = llm.requests[0].body
    system = sent["messages"][0]["content"]
    assert "JSON Schema" in system  # the instruction goes to every profile
    if json_schema:
        assert sent["response_format"]["type"] == "json_schema"
        assert sent["response_format"]["json_schema"]["schema"] == SCHEMA
    else:
        assert "response_format" not in sent


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"type": "array"}, "must describe an object"),
        ({"type": "object", "properties": {"a": {"$ref": "https://x.example/s"}}}, "local $ref"),
        ({"type": "object", "properties": {"a": {"type": 5}}}, "not a valid JSON Schema"),
        (
            {"type": "object", "properties": {"a": {"enum": ["x" * 100] * 400}}},
            "bytes; at most",
        ),
    ],
)
def test_bad_schemas_are_refused(sqlite_rt: Runtime, schema: Any, message: str) -> None:
    body = {"kind": "agent", "model": "demo", "output_schema": schema}
    with TestClient(create_app(lambda: sqlite_rt)) as client:
        res = client.post("/v1/runs", json={"agent": body, "input": "hi"})
    assert res.status_code == 422, res.text
    assert message in res.text


def test_deep_schema_is_refused(sqlite_rt: Runtime) -> None:
    inner: dict[str, Any] = {"type": "string"}
    for _ in range(20):
        inner = {"type": "object", "properties": {"a": inner}}
    body = {"kind": "agent", "model": "demo", "output_schema": inner}
    with TestClient(create_app(lambda: sqlite_rt)) as client:
        res = client.post("/v1/runs", json={"agent": body, "input": "hi"})
    assert res.status_code == 422
    assert "nests deeper" in res.text
