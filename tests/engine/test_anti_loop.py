"""SPEC L-3 anti-loop, read off the requests the fake OpenAI server recorded (stub broker).

Too many tool-only rounds (more than ``force_answer_after``), or 3 identical rounds in a row,
make the next request carry ``tool_choice: "none"``; a round with answer text resets the count.
In prompt mode there is no ``tool_choice``: that round's prompt leaves the tools out."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from scheduler.app import create_app
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.llm.fake_server import FakeLLMServer, ReplySpec

Round = Callable[[int], ReplySpec]


@pytest.fixture
def llm() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as server:
        yield server


@pytest.fixture
def client(sqlite_rt: Runtime) -> Iterator[TestClient]:
    with TestClient(create_app(lambda: sqlite_rt)) as c:
        yield c


def _calc(n: int, expression: str, text: str = "") -> ReplySpec:
    call = {"id": f"call_r{n}", "name": "calculator", "arguments": {"expression": expression}}
    return ReplySpec(text=text, tool_calls=[call])


def _responder(by_round: Round) -> Callable[[dict[str, Any]], ReplySpec]:
    """Answer when tools are forced off; else the reply of this round (assistant turns so far)."""

    def reply(body: dict[str, Any]) -> ReplySpec:
        if body.get("tool_choice") == "none":
            return ReplySpec(text="Final answer.")
        done = sum(1 for m in body["messages"] if m["role"] == "assistant")
        return by_round(done)

    return reply


def _run(
    client: TestClient, rt: Runtime, stub: StubBroker, llm: FakeLLMServer, **spec: Any
) -> dict[str, Any]:
    model = {"provider": "openai", "base_url": llm.base_url, "model": "fake-1"}
    model.update(spec.pop("model", {}))
    agent = {"kind": "agent", "model": model, "tools": ["calculator"], "max_rounds": 20, **spec}
    run = client.post("/v1/runs", json={"agent": agent, "input": "compute"}).json()
    stub.drain(rt)
    return dict(client.get(f"/v1/runs/{run['id']}").json())


def _choices(llm: FakeLLMServer) -> list[str | None]:
    return [b.get("tool_choice") for b in llm.bodies]


def test_tool_only_rounds_past_force_answer_after_force_none(
    client: TestClient, sqlite_rt: Runtime, stub: StubBroker, llm: FakeLLMServer
) -> None:
    llm.responder = _responder(lambda n: _calc(n, f"{n}+1"))  # never identical, never any text
    run = _run(client, sqlite_rt, stub, llm, force_answer_after=2)
    assert (run["status"], run["result"]["text"]) == ("completed", "Final answer.")
    # three tool-only rounds exceed 2: the fourth request forces an answer
    assert _choices(llm) == [None, None, None, "none"]
    assert "tools" in llm.bodies[3]  # the tools stay described; only their use is off


def test_a_round_with_answer_text_resets_the_count(
    client: TestClient, sqlite_rt: Runtime, stub: StubBroker, llm: FakeLLMServer
) -> None:
    texts = {2: "Halfway there."}  # round 3 says something besides its call
    llm.responder = _responder(lambda n: _calc(n, f"{n}+1", texts.get(n, "")))
    run = _run(client, sqlite_rt, stub, llm, force_answer_after=2)
    assert run["status"] == "completed"
    assert _choices(llm) == [None, None, None, None, None, None, "none"]


def test_three_identical_rounds_force_none(
    client: TestClient, sqlite_rt: Runtime, stub: StubBroker, llm: FakeLLMServer
) -> None:
    # even with text in every round and a high force_answer_after
    llm.responder = _responder(lambda n: _calc(n, "2+2", text="Checking again."))
    run = _run(client, sqlite_rt, stub, llm, force_answer_after=50)
    assert (run["status"], run["result"]["text"]) == ("completed", "Final answer.")
    assert _choices(llm) == [None, None, None, "none"]


def test_a_different_round_breaks_the_identical_streak(
    client: TestClient, sqlite_rt: Runtime, stub: StubBroker, llm: FakeLLMServer
) -> None:
    exprs = ["2+2", "2+2", "3+3", "3+3", "3+3"]
    llm.responder = _responder(lambda n: _calc(n, exprs[n], text="Again."))
    run = _run(client, sqlite_rt, stub, llm, force_answer_after=50)
    assert run["status"] == "completed"
    assert _choices(llm) == [None, None, None, None, None, "none"]


def test_prompt_mode_leaves_the_tools_out_instead(
    client: TestClient, sqlite_rt: Runtime, stub: StubBroker, llm: FakeLLMServer
) -> None:
    def prompt_round(body: dict[str, Any]) -> ReplySpec:
        system = str(body["messages"][0]["content"])
        if "calculator" not in system:  # the forced round: no tool described
            return ReplySpec(text="0: Final answer.")
        return ReplySpec(text='1: {"name": "calculator", "arguments": {"expression": "2+2"}}')

    llm.responder = prompt_round
    run = _run(client, sqlite_rt, stub, llm, model={"tool_mode": "prompt"})
    assert (run["status"], run["result"]["text"]) == ("completed", "Final answer.")
    assert _choices(llm) == [None] * 4  # never sent in prompt mode
    described = ["calculator" in str(b["messages"][0]["content"]) for b in llm.bodies]
    assert described == [True, True, True, False]
