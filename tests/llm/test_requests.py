"""What goes on the wire: SPEC M-1 (endpoint, stream options), M-5 (messages), M-7 (modes)."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest

from shared.agent.messages import Message, ToolCall
from shared.errors import FatalModelError
from shared.llm.openai_compat import OpenAICompatModel, build_body, wire_messages

from .helpers import CALC, mock_model, profile, request, sse_response, user

OK_STREAM = (
    b'data: {"choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":"stop"}]}\n\n'
    b"data: [DONE]\n\n"
)

HISTORY = (
    Message(role="system", content="sys"),
    user("question"),
    Message(role="assistant", content="   "),  # blank, no calls → dropped
    Message(role="user", content=""),  # blank → dropped
    Message(role="user", content=[{"type": "text", "text": " "}]),  # blank parts → dropped
    Message(
        role="assistant",
        content="",
        tool_calls=(ToolCall("c1", "calculator", '{"expression": "1+1"}'),),
    ),
    Message(role="tool", content="", tool_call_id="c1", name="calculator"),
    Message(role="user", content=[{"type": "image_url", "image_url": {"url": "data:x"}}]),
)


def _capture(**profile_kw: Any) -> tuple[list[httpx.Request], Any]:
    seen: list[httpx.Request] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        return sse_response(OK_STREAM)

    return seen, mock_model(handler, **profile_kw)


def _keys(obj: Any) -> set[str]:
    if isinstance(obj, dict):
        return set(obj) | {k for v in obj.values() for k in _keys(v)}
    if isinstance(obj, list):
        return {k for v in obj for k in _keys(v)}
    return set()


def test_post_to_chat_completions_streaming_with_usage() -> None:
    # SPEC M-1
    seen, model = _capture(base_url="http://h/v1/")
    assert model.complete(request()).text == "ok"
    sent = seen[0]
    assert sent.method == "POST" and str(sent.url) == "http://h/v1/chat/completions"
    body = json.loads(sent.content)
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert sent.headers["accept"] == "text/event-stream"


def test_stream_usage_off() -> None:
    # SPEC M-1: stream_options only where the profile allows it
    body = build_body(profile(stream_usage=False), request(), "native")
    assert "stream_options" not in body


def test_message_filtering_and_lowercase_keys() -> None:
    # SPEC M-5
    wire = wire_messages(HISTORY)
    assert [m["role"] for m in wire] == ["system", "user", "assistant", "tool", "user"]
    assert wire[2]["tool_calls"][0]["function"]["name"] == "calculator"
    assert wire[3] == {"role": "tool", "content": "(empty)", "tool_call_id": "c1"}
    keys = _keys(wire)
    assert not any(re.match(r"[A-Z]", k) for k in keys)
    assert not {"hidden", "kind", "reasoning"} & keys


def test_body_fields_from_request_and_profile() -> None:
    # SPEC M-5: max_tokens, tool_choice, response_format; extra merged
    prof = profile(max_tokens=1000, extra={"temperature": 0.2, "max_tokens": None, "seed": 1})
    req = request(
        tools=(CALC,),
        tool_choice="none",
        max_tokens=500,
        response_format={"type": "json_object"},
    )
    body = build_body(prof, req, "native")
    assert body["tools"] == [CALC.to_wire()] and body["tool_choice"] == "none"
    assert body["response_format"] == {"type": "json_object"}
    assert body["temperature"] == 0.2 and body["seed"] == 1
    assert "max_tokens" not in body  # an extra null removes a default field
    body = build_body(profile(max_tokens=1000), request(max_tokens=5000), "native")
    assert body["max_tokens"] == 1000
    assert build_body(profile(), request(), "native")["max_tokens"] == 4096
    assert "tools" not in body and "tool_choice" not in body


def test_named_tool_choice() -> None:
    body = build_body(profile(), request(tools=(CALC,), tool_choice="calculator"), "native")
    assert body["tool_choice"] == {"type": "function", "function": {"name": "calculator"}}


def test_function_mode_body_and_history() -> None:
    # SPEC M-7: legacy functions/function_call, one call per assistant turn
    history = (
        user("q"),
        Message(
            role="assistant",
            content="thinking aloud",
            tool_calls=(ToolCall("a", "calculator", "{}"), ToolCall("b", "calculator", "{}")),
        ),
        Message(role="tool", content="1", tool_call_id="a"),
        Message(role="tool", content="", tool_call_id="b"),
    )
    body = build_body(profile(), request(*history, tools=(CALC,), tool_choice="auto"), "function")
    assert body["functions"] == [CALC.to_wire()["function"]] and body["function_call"] == "auto"
    assert "tools" not in body
    msgs = body["messages"]
    assert msgs[1]["function_call"] == {"name": "calculator", "arguments": "{}"}
    assert msgs[1]["content"] == "thinking aloud" and msgs[2]["content"] is None
    assert msgs[3] == {"role": "function", "name": "calculator", "content": "1"}
    assert msgs[4] == {"role": "function", "name": "calculator", "content": "(empty)"}


def test_prompt_mode_body_has_no_tools() -> None:
    # SPEC M-7
    body = build_body(profile(), request(user("q"), tools=(CALC,), tool_choice="auto"), "prompt")
    assert "tools" not in body and "tool_choice" not in body and "functions" not in body
    assert body["messages"][0]["role"] == "system"
    assert "1: {" in body["messages"][0]["content"]


def test_prompt_mode_with_tool_choice_none_describes_no_tools() -> None:
    body = build_body(profile(), request(user("q"), tools=(CALC,), tool_choice="none"), "prompt")
    assert [m["role"] for m in body["messages"]] == ["user"]


def test_api_key_from_env_at_call_time(monkeypatch: pytest.MonkeyPatch) -> None:
    seen, model = _capture(api_key_env="TREADLE_TEST_KEY")
    monkeypatch.setenv("TREADLE_TEST_KEY", "sk-first")
    model.complete(request())
    monkeypatch.setenv("TREADLE_TEST_KEY", "sk-second")
    model.complete(request())
    assert [r.headers["authorization"] for r in seen] == ["Bearer sk-first", "Bearer sk-second"]


def test_missing_api_key_env_fails_without_leaking(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TREADLE_TEST_KEY", raising=False)
    _, model = _capture(api_key_env="TREADLE_TEST_KEY")
    with pytest.raises(FatalModelError, match="TREADLE_TEST_KEY is not set"):
        model.complete(request())


def test_explicit_key_and_no_key() -> None:
    seen: list[httpx.Request] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        return sse_response(OK_STREAM)

    client = httpx.Client(transport=httpx.MockTransport(handler))
    OpenAICompatModel(profile(), client=client).complete(request())
    OpenAICompatModel(profile(), api_key="sk-x", client=client).complete(request())
    assert "authorization" not in seen[0].headers
    assert seen[1].headers["authorization"] == "Bearer sk-x"


def test_key_never_appears_in_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TREADLE_TEST_KEY", "sk-secret-123")

    def handler(_: httpx.Request) -> httpx.Response:
        return httpx.Response(401, json={"error": {"message": "Incorrect API key provided"}})

    model = mock_model(handler, api_key_env="TREADLE_TEST_KEY")
    with pytest.raises(FatalModelError) as info:
        model.complete(request())
    assert "sk-secret-123" not in repr(info.value) and "sk-secret-123" not in str(info.value)
