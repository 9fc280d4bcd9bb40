"""kind chat and the helper kinds as runs on the stub broker (SPEC C-1..C-4, H-1..H-3), and a
chat or helper agent used as a tool of a tool agent (C-4)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

import tests.plugins  # noqa: F401  (registers the test tools)
from shared.agent.spec import AgentSpec
from shared.engine import commands, threads
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.llm.fake_server import FakeLLMServer, ReplySpec
from shared.store import calls as call_store
from shared.store import records
from shared.store import runs as run_store

CATEGORIES = [
    {"key": "weather", "description": "questions about weather"},
    {"key": "travel", "description": "trips and bookings"},
    {"key": "other", "description": "anything else"},
]
FIELDS = [
    {"name": "city", "type": "string", "required": True},
    {"name": "days", "type": "integer", "required": True, "default": 1},
    {"name": "budget", "type": "number"},
]


@pytest.fixture
def llm() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as server:
        yield server


def _openai(llm: FakeLLMServer, **profile: Any) -> dict[str, Any]:
    return {
        "provider": "openai",
        "base_url": llm.base_url,
        "model": "m",
        "api_key_env": None,
        **profile,
    }


def _scripted(*replies: dict[str, Any], **profile: Any) -> dict[str, Any]:
    return {"provider": "scripted", "replies": list(replies), **profile}


def _spec(kind: str, model: dict[str, Any], **kw: Any) -> AgentSpec:
    return AgentSpec.model_validate({"kind": kind, "model": model, **kw})


def _submit(rt: Runtime, spec: AgentSpec, text: str = "go", **kw: Any) -> str:
    row, _ = commands.submit_run(rt, commands.RunInput(agent=spec, input=text, **kw))
    return str(row["id"])


def _run(rt: Runtime, run_id: str) -> Any:
    with rt.engine.connect() as conn:
        return run_store.get_run(conn, run_id)


def _complete(rt: Runtime, stub: StubBroker, spec: AgentSpec, text: str, **kw: Any) -> Any:
    run_id = _submit(rt, spec, text, **kw)
    stub.drain(rt)
    run = _run(rt, run_id)
    assert run["status"] == "completed", run["error"]
    return run


# --- C: the chat node ------------------------------------------------------------------


def test_chat_is_one_call_with_quotes_in_the_system_prompt(
    sqlite_rt: Runtime, stub: StubBroker, llm: FakeLLMServer
) -> None:
    # SPEC C-1, C-2
    spec = _spec(
        "chat",
        _openai(llm, default_system_prompt="House rules."),
        system_prompt="Be brief.",
        quote_template="[{{index}}] {{q}} ({{source}})",
    )
    quotes = [{"q": "Oslo is in Norway.", "source": "atlas"}, {"q": "Oslo has fjords."}]
    run = _complete(sqlite_rt, stub, spec, "Where is Oslo?", inputs={"quotes": quotes})
    (body,) = llm.bodies
    system = body["messages"][0]["content"]
    assert system.startswith("House rules.\n\n===---===---===\n\nBe brief.\n\n===---===---===\n\n")
    assert "[1] Oslo is in Norway. (atlas)\n------\n[2] Oslo has fjords. ()" in system
    assert body["messages"][-1] == {"role": "user", "content": "Where is Oslo?"}
    assert "tools" not in body
    assert run["result"] == {"text": "echo: Where is Oslo?"} and run["round"] == 1


def test_chat_quotes_with_a_question_placeholder_go_to_the_user_message(
    sqlite_rt: Runtime, stub: StubBroker, llm: FakeLLMServer
) -> None:
    # SPEC C-2
    spec = _spec("chat", _openai(llm), quote_prompt="Facts:\n{{quote}}\n\nQ: {{question}}")
    _complete(sqlite_rt, stub, spec, "Where?", inputs={"quotes": [{"q": "north", "a": "yes"}]})
    messages = llm.bodies[0]["messages"]
    assert messages == [{"role": "user", "content": "Facts:\nnorth\nyes\n\nQ: Where?"}]


def _deltas(rt: Runtime, stub: StubBroker, spec: AgentSpec) -> tuple[list[str], Any]:
    run_id = _submit(rt, spec, "hi")
    seen: list[str] = []
    cancel = rt.live.subscribe(run_id, lambda e: seen.append(e["type"]))
    stub.drain(rt)
    cancel()
    return [t for t in seen if t.endswith(".delta")], _run(rt, run_id)


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({}, {"reasoning.delta", "text.delta"}),
        ({"stream_reasoning": False}, {"text.delta"}),
        ({"stream_answer": False}, {"reasoning.delta"}),
        ({"stream_reasoning": False, "stream_answer": False}, set()),
    ],
)
def test_streaming_flags_gate_the_live_deltas(
    sqlite_rt: Runtime, stub: StubBroker, flags: dict[str, bool], expected: set[str]
) -> None:
    # SPEC C-4: reasoning and answer deltas each behind a flag; the answer is the run's text
    spec = _spec(
        "chat", _scripted({"text": "The answer is four.", "reasoning": "Two and two."}), **flags
    )
    deltas, run = _deltas(sqlite_rt, stub, spec)
    assert set(deltas) == expected
    assert run["result"]["text"] == "The answer is four."


# --- H: helper kinds ---------------------------------------------------------------------


def test_classify_result(sqlite_rt: Runtime, stub: StubBroker) -> None:
    # SPEC H-1
    spec = _spec(
        "classify",
        _scripted({"text": '{"category": "travel", "reason": "a trip"}'}),
        categories=CATEGORIES,
    )
    run = _complete(sqlite_rt, stub, spec, "Book me a train to Rome")
    assert run["result"] == {
        "text": '{"category": "travel", "reason": "a trip"}',
        "category": "travel",
        "reason": "a trip",
    }
    bad = _complete(
        sqlite_rt,
        stub,
        _spec("classify", _scripted({"text": "dunno"}), categories=CATEGORIES),
        "hm",
    )
    assert bad["result"]["category"] == "other"  # no match → the LAST category


def test_classify_previous_result_on_the_thread_is_context(
    sqlite_rt: Runtime, stub: StubBroker, llm: FakeLLMServer
) -> None:
    # SPEC H-1: the previous result on the same thread is given as context
    llm.script("weather", "weather")
    tid = commands.new_id("thr")
    threads.create_thread(sqlite_rt, "default", None, "enqueue", tid)
    spec = _spec("classify", _openai(llm), categories=CATEGORIES)
    _complete(sqlite_rt, stub, spec, "Will it rain in Oslo?", thread_id=tid)
    _complete(sqlite_rt, stub, spec, "And tomorrow?", thread_id=tid)
    first, second = (b["messages"] for b in llm.bodies)
    assert "Previous result" not in first[0]["content"]
    assert "classified as: weather" in second[0]["content"]
    assert [m["content"] for m in second[1:]] == [
        "Will it rain in Oslo?",
        "weather",
        "And tomorrow?",
    ]


def test_extract_result(sqlite_rt: Runtime, stub: StubBroker) -> None:
    # SPEC H-2: tolerant parse; unknown keys and empty strings dropped; default filled
    reply = 'Here: {city: "Oslo", budget: "", color: "red"} hope that helps'
    spec = _spec("extract", _scripted({"text": reply}), fields=FIELDS)
    run = _complete(sqlite_rt, stub, spec, "A trip to Oslo")
    assert run["result"]["fields"] == {"city": "Oslo", "days": 1}
    assert run["result"]["success"] is True
    bad = _complete(
        sqlite_rt, stub, _spec("extract", _scripted({"text": "no json"}), fields=FIELDS), "?"
    )
    assert bad["result"]["fields"] == {"days": 1} and bad["result"]["success"] is False


def test_extract_sends_a_json_schema_response_format_where_supported(
    sqlite_rt: Runtime, stub: StubBroker, llm: FakeLLMServer
) -> None:
    # SPEC H-2
    llm.script('{"city": "Oslo", "days": 3}', '{"city": "Rome", "days": 2}')
    with_schema = _spec("extract", _openai(llm, json_schema=True), fields=FIELDS)
    run = _complete(sqlite_rt, stub, with_schema, "3 days in Oslo")
    assert run["result"]["fields"] == {"city": "Oslo", "days": 3}
    fmt = llm.bodies[0]["response_format"]
    assert fmt["type"] == "json_schema"
    assert fmt["json_schema"]["schema"]["required"] == ["city", "days"]
    _complete(sqlite_rt, stub, _spec("extract", _openai(llm), fields=FIELDS), "2 days in Rome")
    assert "response_format" not in llm.bodies[1]


def test_expand_query_result_starts_with_the_question(sqlite_rt: Runtime, stub: StubBroker) -> None:
    # SPEC H-3: output = original + kept (the round passes the question to step)
    reply = json.dumps(
        ["reset password steps", "forgot password", "Reset my password", "account recovery email"]
    )
    spec = _spec("expand_query", _scripted({"text": reply}), keep=2)
    run = _complete(sqlite_rt, stub, spec, "Reset my password")
    queries = run["result"]["queries"]
    assert queries[0] == "Reset my password" and len(queries) == 3
    assert "Reset my password" not in queries[1:]  # de-duplicated against the original
    failed = _complete(sqlite_rt, stub, _spec("expand_query", _scripted({"text": "oops"})), "hi")
    assert failed["result"]["queries"] == ["hi"]


# --- C-4: a chat or helper agent as a tool -----------------------------------------------


def _tool_agent(tool: dict[str, Any], answer_call: dict[str, Any]) -> AgentSpec:
    replies = [{"tool_calls": [answer_call]}, {"text": "Done."}]
    return AgentSpec.model_validate(
        {"kind": "agent", "tools": [tool], "model": _scripted(*replies)}
    )


def _tool_message(rt: Runtime, run_id: str) -> dict[str, Any]:
    with rt.engine.connect() as conn:
        (call,) = call_store.list_tool_calls(conn, run_id)
        tool_msgs = [m for m in records.list_messages(conn, run_id) if m["role"] == "tool"]
    assert [m["content"] for m in tool_msgs] == [call["result"]]
    return dict(call)


def test_a_chat_agent_as_a_tool(sqlite_rt: Runtime, stub: StubBroker) -> None:
    # SPEC C-4: "the answer is also the run's text, so a chat agent can serve as a tool"
    pricing = {"tiers": [{"input": 1.0, "output": 1.0}]}
    expert = {
        "kind": "chat",
        "system_prompt": "You know capitals.",
        "model": _scripted({"text": "Paris."}, pricing=pricing),
    }
    tool = {"name": "ask_expert", "description": "Ask the expert.", "agent": expert}
    spec = _tool_agent(
        tool, {"id": "c1", "name": "ask_expert", "arguments": {"input": "Capital of France?"}}
    )
    run = _complete(sqlite_rt, stub, spec, "What is the capital of France?")
    call = _tool_message(sqlite_rt, run["id"])
    assert call["result"] == "Paris." and call["read_only"] is False
    assert call["cost"] > 0 and run["cost"] >= call["cost"]  # SPEC L-10: tool cost in the total
    assert call["data"]["agent_kind"] == "chat"
    assert run["result"]["text"] == "Done."


def test_a_helper_agent_as_a_tool_returns_its_structured_result(
    sqlite_rt: Runtime, stub: StubBroker
) -> None:
    router = {"kind": "classify", "categories": CATEGORIES, "model": _scripted({"text": "weather"})}
    tool = {"name": "route", "agent": router, "read_only": True}
    spec = _tool_agent(tool, {"id": "c1", "name": "route", "arguments": {"input": "rain?"}})
    run = _complete(sqlite_rt, stub, spec, "Is it going to rain?")
    call = _tool_message(sqlite_rt, run["id"])
    assert json.loads(call["result"]) == {"category": "weather"}
    assert call["read_only"] is True


def test_an_agent_tool_declares_an_input_parameter(sqlite_rt: Runtime, stub: StubBroker) -> None:
    from shared.engine.catalog import build_catalog

    spec = _tool_agent({"name": "ask", "agent": {"kind": "chat"}}, {"id": "c", "name": "ask"})
    entry = build_catalog(spec).entries["ask"]
    assert entry.parameters["required"] == ["input"]


def test_an_agent_tool_failure_is_a_tool_result(
    sqlite_rt: Runtime, stub: StubBroker, llm: FakeLLMServer
) -> None:
    # SPEC L-5: tool failure is data
    llm.enqueue(ReplySpec(status=400, body={"error": {"message": "bad request"}}))
    tool = {"name": "ask", "agent": {"kind": "chat", "model": _openai(llm)}}
    spec = _tool_agent(tool, {"id": "c1", "name": "ask", "arguments": {"input": "x"}})
    run = _complete(sqlite_rt, stub, spec, "go")
    assert _tool_message(sqlite_rt, run["id"])["result"].startswith("Tool error: ")


def test_a_tool_agent_as_a_tool_is_a_sub_agent() -> None:
    # a tool agent (kind agent) is not one call: it runs as a child run
    from shared.engine.catalog import build_catalog
    from shared.tools.agent_tool import SubAgentTool

    spec = AgentSpec.model_validate(
        {"kind": "agent", "tools": [{"name": "sub", "agent": {"kind": "agent"}}]}
    )
    assert isinstance(build_catalog(spec).tools["sub"], SubAgentTool)
