"""The model client inside runs, against the fake OpenAI-compatible server.
Real HTTP; the stub broker drives the rounds."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from scheduler.app import create_app
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.llm.fake_server import FakeLLMServer, ReplySpec


@pytest.fixture
def llm() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as server:
        yield server


@pytest.fixture
def client(sqlite_rt: Runtime) -> Iterator[TestClient]:
    with TestClient(create_app(lambda: sqlite_rt)) as c:
        yield c


def _agent(llm: FakeLLMServer, **profile: Any) -> dict[str, Any]:
    model = {"provider": "openai", "base_url": llm.base_url, "model": "fake-1", **profile}
    return {"kind": "agent", "model": model, "tools": ["calculator"], "max_rounds": 5}


def _run(
    client: TestClient,
    sqlite_rt: Runtime,
    stub: StubBroker,
    agent: dict[str, Any],
    text: str = "What is 6*7?",
) -> dict[str, Any]:
    run = client.post("/v1/runs", json={"agent": agent, "input": text}).json()
    stub.drain(sqlite_rt)
    return dict(client.get(f"/v1/runs/{run['id']}").json())


def _messages(client: TestClient, run_id: str) -> list[dict[str, Any]]:
    return list(client.get(f"/v1/runs/{run_id}/messages").json()["messages"])


def test_reply_stored_exactly_as_streamed(
    client: TestClient, sqlite_rt: Runtime, stub: StubBroker, llm: FakeLLMServer
) -> None:
    # SPEC M-2..M-4 through a run: text, reasoning and tool calls as streamed
    llm.script(
        ReplySpec(
            reasoning="Multiply.",
            text="Let me compute. ",
            tool_calls=[{"id": "call_x", "name": "calculator", "arguments": {"expression": "6*7"}}],
            chunk_bytes=7,
            no_space=True,
            comments=True,
        ),
        ReplySpec(reasoning="Done thinking.", text="It is 42.", chunk_bytes=5),
    )
    run = _run(client, sqlite_rt, stub, _agent(llm))
    assert run["status"] == "completed" and run["result"]["text"] == "It is 42."
    msgs = _messages(client, run["id"])
    first = msgs[1]
    assert first["content"] == "Let me compute. " and first["reasoning"] == "Multiply."
    assert first["tool_calls"] == [
        {"id": "call_x", "name": "calculator", "arguments": '{"expression": "6*7"}'}
    ]
    assert msgs[2]["content"] == "42" and msgs[3]["reasoning"] == "Done thinking."


def test_tools_rejected_with_400_still_completes(
    client: TestClient, sqlite_rt: Runtime, stub: StubBroker, llm: FakeLLMServer
) -> None:
    # SPEC M-6: resent once without tools
    llm.script(ReplySpec(reject_tools=True), ReplySpec(text="Forty-two."))
    run = _run(client, sqlite_rt, stub, _agent(llm, tool_mode="native"))
    assert run["status"] == "completed" and run["result"]["text"] == "Forty-two."
    bodies = llm.bodies
    assert "tools" in bodies[0] and "tools" not in bodies[1]


def test_prompt_mode_completes_a_tool_round_trip(
    client: TestClient, sqlite_rt: Runtime, stub: StubBroker, llm: FakeLLMServer
) -> None:
    # SPEC M-7: tools described in the prompt; `1: {...}` is a call; `0: ...` an answer
    llm.script(
        ReplySpec(text='1: {"name": "calculator", "arguments": {"expression": "6*7"}}'),
        ReplySpec(text="0: The answer is 42."),
    )
    run = _run(client, sqlite_rt, stub, _agent(llm, tool_mode="prompt"))
    assert run["status"] == "completed"
    assert run["result"]["text"] == "The answer is 42."
    second = llm.bodies[1]
    assert "tools" not in second and "tool_choice" not in second
    assert any(
        "<tool_response" in str(m["content"]) and "42" in str(m["content"])
        for m in second["messages"]
        if m["role"] == "user"
    ), second["messages"]


def test_unauthorized_fails_at_once_with_provider_message(
    client: TestClient, sqlite_rt: Runtime, stub: StubBroker, llm: FakeLLMServer
) -> None:
    # SPEC M-8: other 4xx are fatal with the provider's message
    llm.script(
        ReplySpec(
            status=401,
            body={
                "error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}
            },
        )
    )
    run = _run(client, sqlite_rt, stub, _agent(llm))
    assert run["status"] == "failed"
    assert "Incorrect API key provided" in run["error"]["message"]
    assert len(llm.requests) == 1 and stub.retries == []


def test_transient_errors_are_retried_then_the_run_completes(
    client: TestClient, sqlite_rt: Runtime, stub: StubBroker, llm: FakeLLMServer
) -> None:
    # SPEC M-8: 429 with Retry-After → retried no sooner than it says
    llm.script(
        ReplySpec(
            status=429, headers={"Retry-After": "2"}, body={"error": {"message": "slow down"}}
        ),
        ReplySpec(status=500, body={"error": {"message": "boom"}}),
        ReplySpec(text="fine"),
    )
    run = _run(client, sqlite_rt, stub, _agent(llm))
    assert run["status"] == "completed" and run["result"]["text"] == "fine"
    assert stub.retries[0] >= 2.0 and len(stub.retries) == 2


def test_requests_have_wire_keys_and_no_empty_turns(
    client: TestClient, sqlite_rt: Runtime, stub: StubBroker, llm: FakeLLMServer
) -> None:
    # SPEC M-5: lowercase wire keys; empty user/assistant turns dropped; tool turns kept
    llm.script(
        ReplySpec(tool_calls=[{"name": "calculator", "arguments": {"expression": "1+1"}}]),
        ReplySpec(text="2"),
    )
    inp = [
        {"role": "user", "content": "  "},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "1+1?"},
    ]
    run = client.post("/v1/runs", json={"agent": _agent(llm), "input": inp}).json()
    stub.drain(sqlite_rt)
    assert client.get(f"/v1/runs/{run['id']}").json()["status"] == "completed"
    for body in llm.bodies:
        for m in body["messages"]:
            assert all(re.fullmatch(r"[a-z_]+", k) for k in m), m
            if m["role"] in ("user", "assistant") and not m.get("tool_calls"):
                assert str(m.get("content") or "").strip(), m
    assert [m["role"] for m in llm.bodies[1]["messages"]][-2:] == ["assistant", "tool"]
