"""The real client against the fake OpenAI-compatible server over real HTTP (127.0.0.1)."""

from __future__ import annotations

import json
import re
import threading
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import httpx
import pytest

from shared.agent.messages import Message, ToolCall
from shared.errors import FatalModelError, ToolsRejected, TransientModelError
from shared.llm.base import Delta
from shared.llm.fake_server import FakeLLMServer, ReplySpec

from .helpers import CALC, SSE_DIR, fake_model, request, user


def test_echo_by_default(fake: FakeLLMServer) -> None:
    reply = fake_model(fake).complete(request(user("hello there")))
    assert reply.text == "echo: hello there" and reply.finish_reason == "stop"
    assert reply.usage is not None and not reply.usage.estimated  # include_usage honoured
    assert fake.requests[0].path == "/v1/chat/completions"


def test_queue_then_responder(fake: FakeLLMServer) -> None:
    fake.script("first", {"text": "second"})
    fake.responder = lambda body: ReplySpec(text=f"{len(body['messages'])} messages")
    model = fake_model(fake)
    assert [model.complete(request()).text for _ in range(3)] == ["first", "second", "1 messages"]
    assert fake.pending == 0


def test_tool_calls_reasoning_and_faulty_framing(fake: FakeLLMServer) -> None:
    # SPEC M-2/M-4 over HTTP: byte-split chunks, data: without space, comment lines
    fake.enqueue(
        ReplySpec(
            text="Lé résultat 😊",
            reasoning="thinking",
            tool_calls=[{"name": "calculator", "arguments": {"expression": "2+2"}, "id": "c1"}],
            chunk_bytes=5,
            no_space=True,
            comments=True,
        )
    )
    deltas: list[Delta] = []
    reply = fake_model(fake).complete(request(tools=(CALC,)), deltas.append)
    assert reply.text == "Lé résultat 😊" and reply.reasoning == "thinking"
    assert reply.tool_calls == (ToolCall("c1", "calculator", '{"expression": "2+2"}'),)
    assert reply.finish_reason == "tool_calls"
    assert {d.kind for d in deltas} == {"text", "reasoning", "tool"}


def test_recorded_fixture_replayed_over_http(fake: FakeLLMServer) -> None:
    raw = (SSE_DIR / "openai_gpt4o_parallel_tool_calls.txt").read_bytes()
    fake.enqueue(ReplySpec(raw=raw, chunk_bytes=97))
    reply = fake_model(fake).complete(request())
    assert [c.name for c in reply.tool_calls] == ["get_country", "get_product_name"]


def test_400_with_tools_retry(fake: FakeLLMServer) -> None:
    # SPEC M-6: 400 to the request with tools, resent once without tools
    fake.responder = lambda body: ReplySpec(text="no tools then", reject_tools=True)
    reply = fake_model(fake, tool_mode="native").complete(request(tools=(CALC,)))
    assert reply.text == "no tools then"
    bodies = fake.bodies
    assert len(bodies) == 2 and "tools" in bodies[0] and "tools" not in bodies[1]


def test_400_with_tools_then_400_raises_the_first(fake: FakeLLMServer) -> None:
    # SPEC M-6: both fail → the FIRST 400
    fake.script(
        ReplySpec(status=400, body={"error": {"message": "first: tools unsupported"}}),
        ReplySpec(status=400, body={"error": {"message": "second: something else"}}),
    )
    with pytest.raises(ToolsRejected, match="first: tools unsupported"):
        fake_model(fake, tool_mode="native").complete(request(tools=(CALC,)))
    assert len(fake.requests) == 2


def _calculator_responder(body: dict[str, Any]) -> ReplySpec:
    """Prompt-mode model: calls the calculator once, then answers from the tool response."""
    messages = body["messages"]
    results = [
        m["content"] for m in messages if m["role"] == "user" and "<tool_response" in m["content"]
    ]
    if results:
        value = re.search(r">\n(.*)\n</tool_response>", results[-1])
        return ReplySpec(text=f"0: The answer is {value.group(1) if value else '?'}.")
    return ReplySpec(text='1: {"name": "calculator", "arguments": {"expression": "6*7"}}')


def test_prompt_mode_round_trip(fake: FakeLLMServer) -> None:
    # SPEC M-7: auto → tools rejected → prompt mode (remembered) → call → result → answer
    fake.reject_tools = True
    fake.responder = _calculator_responder
    model = fake_model(fake, tool_mode="auto", name="no-tools-model")
    history = [Message(role="system", content="Be exact."), user("What is 6*7?")]
    first = model.complete(request(*history, tools=(CALC,)))
    assert model.tool_modes.get(model.profile) == "prompt"
    call = first.tool_calls[0]
    assert call.name == "calculator" and json.loads(call.arguments) == {"expression": "6*7"}

    history += [first.to_message(), Message(role="tool", content="42", tool_call_id=call.id)]
    deltas: list[Delta] = []
    second = model.complete(request(*history, tools=(CALC,)), deltas.append)
    assert second.text == "The answer is 42." and second.tool_calls == ()
    assert "".join(d.text for d in deltas if d.kind == "text") == "The answer is 42."

    sent = fake.bodies[-1]
    assert "tools" not in sent
    assert sent["messages"][0]["role"] == "system" and "<tools>" in sent["messages"][0]["content"]
    assert sent["messages"][2]["content"].startswith('1: {"name": "calculator"')
    assert sent["messages"][3]["role"] == "user"
    assert len(fake.bodies) == 3  # the rejected native call, then two prompt-mode calls


@pytest.mark.parametrize("kind", ["seconds", "date"])
def test_429_retry_after(fake: FakeLLMServer, kind: str) -> None:
    # SPEC M-8: 429 is transient; Retry-After in seconds or as an HTTP date
    value = (
        "7"
        if kind == "seconds"
        else format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    )
    body = {"error": {"message": "Rate limit reached for requests", "type": "rate_limit"}}
    fake.enqueue(ReplySpec(status=429, body=body, headers={"Retry-After": value}))
    with pytest.raises(TransientModelError, match="Rate limit reached") as info:
        fake_model(fake).complete(request())
    assert info.value.status == 429
    assert info.value.retry_after is not None
    if kind == "seconds":
        assert info.value.retry_after == 7.0
    else:
        assert 25 <= info.value.retry_after <= 30


def test_401_is_fatal_with_the_provider_message(fake: FakeLLMServer) -> None:
    # SPEC M-8
    body = {"error": {"message": "Incorrect API key provided: sk-****", "code": "invalid_api_key"}}
    fake.enqueue(ReplySpec(status=401, body=body))
    with pytest.raises(FatalModelError, match="Incorrect API key provided") as info:
        fake_model(fake).complete(request())
    assert info.value.status == 401 and not isinstance(info.value, TransientModelError)


def test_500_is_transient(fake: FakeLLMServer) -> None:
    fake.enqueue(ReplySpec(status=500))
    with pytest.raises(TransientModelError):
        fake_model(fake).complete(request())


def test_read_timeout_is_transient(fake: FakeLLMServer) -> None:
    # SPEC M-8: the server stalls past the read timeout
    fake.enqueue(ReplySpec(text="late", hang=3))
    started = time.monotonic()
    with pytest.raises(TransientModelError, match="ReadTimeout"):
        fake_model(fake, timeout_read=0.3).complete(request())
    assert time.monotonic() - started < 2


def test_first_byte_latency_past_the_read_timeout(fake: FakeLLMServer) -> None:
    fake.enqueue(ReplySpec(text="late", first_byte_latency=3))
    with pytest.raises(TransientModelError, match="timed out"):
        fake_model(fake, timeout_read=0.3).complete(request())


def test_stream_cut_is_transient(fake: FakeLLMServer) -> None:
    # SPEC M-8: the connection closes mid-body without [DONE]: a broken stream
    fake.enqueue(ReplySpec(text="one two three four", cut_after=3))
    deltas: list[Delta] = []
    with pytest.raises(TransientModelError, match="RemoteProtocolError"):
        fake_model(fake).complete(request(), deltas.append)
    assert deltas  # some text had streamed before the cut


def test_error_chunk_and_error_event(fake: FakeLLMServer) -> None:
    # SPEC M-2
    fake.script(
        ReplySpec(text="partial", error_chunk={"code": 400, "message": "Token limit reached"}),
        ReplySpec(
            text="partial",
            error_event={"message": "overloaded", "type": "overloaded_error"},
            done=False,
        ),
    )
    model = fake_model(fake)
    with pytest.raises(FatalModelError, match="Token limit reached"):
        model.complete(request())
    with pytest.raises(TransientModelError, match="overloaded"):
        model.complete(request())


def test_non_streaming_json(fake: FakeLLMServer) -> None:
    fake.enqueue(
        ReplySpec(text="json reply", tool_calls=[{"name": "calculator", "arguments": "{}"}])
    )
    reply = fake_model(fake, stream=False).complete(request(tools=(CALC,)))
    assert reply.text == "json reply" and reply.tool_calls[0].name == "calculator"
    assert reply.usage is not None and not reply.usage.estimated


def test_function_mode_over_http(fake: FakeLLMServer) -> None:
    # SPEC M-7 legacy function calling
    fake.enqueue(ReplySpec(tool_calls=[{"name": "calculator", "arguments": {"expression": "1"}}]))
    reply = fake_model(fake, tool_mode="function").complete(request(tools=(CALC,)))
    assert reply.tool_calls == (ToolCall("call_0", "calculator", '{"expression": "1"}'),)
    assert reply.finish_reason == "function_call" and "functions" in fake.bodies[0]


def test_recorded_requests_have_wire_keys_and_no_empty_turns(fake: FakeLLMServer) -> None:
    # SPEC M-5 on the wire
    history = (
        Message(role="system", content="sys", hidden=True, kind="history"),
        user("q"),
        Message(role="assistant", content=" ", reasoning="secret thoughts"),
        Message(role="assistant", content="", tool_calls=(ToolCall("c", "calculator", "{}"),)),
        Message(role="tool", content="", tool_call_id="c", name="calculator"),
        user("   "),
    )
    fake_model(fake, tool_mode="native").complete(request(*history, tools=(CALC,)))
    recorded = fake.requests[0]
    body = recorded.body

    def keys(obj: Any) -> set[str]:
        if isinstance(obj, dict):
            return set(obj) | {k for v in obj.values() for k in keys(v)}
        return {k for v in obj for k in keys(v)} if isinstance(obj, list) else set()

    assert not [k for k in keys(body) if k[:1].isupper()]
    for msg in body["messages"]:
        if msg["role"] in ("user", "assistant") and not msg.get("tool_calls"):
            assert isinstance(msg["content"], str) and msg["content"].strip()
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "tool"]
    assert body["messages"][3]["content"] == "(empty)"
    assert "secret thoughts" not in json.dumps(body)
    assert recorded.headers["content-type"] == "application/json"


def test_max_concurrency_is_tracked(fake: FakeLLMServer) -> None:
    fake.responder = lambda body: ReplySpec(text="slow", first_byte_latency=0.3)
    model = fake_model(fake)
    threads = [threading.Thread(target=model.complete, args=(request(),)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert fake.max_concurrency == 4 and len(fake.requests) == 4


def test_models_and_health_endpoints(fake: FakeLLMServer) -> None:
    assert httpx.get(fake.base_url + "/models").json()["data"][0]["id"] == "fake"
    assert httpx.get(fake.base_url.removesuffix("/v1") + "/healthz").json() == {"ok": True}
    bad = httpx.post(fake.base_url + "/chat/completions", content=b"nope")
    assert bad.status_code == 400


def _calc_call(call_id: str = "c1") -> Message:
    return Message(role="assistant", tool_calls=(ToolCall(call_id, "calculator", "{}"),))


def test_strict_refuses_a_dangling_tool_call_as_openai_does(fake: FakeLLMServer) -> None:
    fake.enqueue("kept for the next request")
    dangling = request(user("q"), _calc_call("c1"), user("and?"))
    with pytest.raises(FatalModelError) as err:
        fake_model(fake).complete(dangling)
    assert err.value.status == 400
    assert "The following tool_call_ids did not have response messages: c1" in str(err.value)
    assert fake.violations and fake.pending == 1  # the programmed reply was not taken
    answered = Message(role="tool", content="4", tool_call_id="c1", name="calculator")
    ok = request(user("q"), _calc_call("c1"), answered)
    assert fake_model(fake).complete(ok).text == "kept for the next request"
    fake.reset()


def test_a_refused_request_hidden_by_a_fallback_still_fails_the_test() -> None:
    # auto tool mode retries a 400 in prompt mode (SPEC M-6), where the history has no
    # tool_calls: the run goes on, so the server's exit check is what catches it
    dangling = request(user("q"), _calc_call("c1"), user("and?"), tools=(CALC,))
    with pytest.raises(AssertionError, match="strict provider refuses"), FakeLLMServer() as server:
        assert fake_model(server).complete(dangling).text == "echo: and?"


def test_strict_refuses_a_tool_message_without_a_call(fake: FakeLLMServer) -> None:
    orphan = Message(role="tool", content="4", tool_call_id="c9", name="calculator")
    with pytest.raises(FatalModelError, match="must be a response to a preceeding message"):
        fake_model(fake).complete(request(user("q"), orphan))
    fake.reset()  # the violation was the point: the server's exit check must not see it


def test_lenient_server_accepts_what_a_strict_one_refuses(fake: FakeLLMServer) -> None:
    fake.strict = False
    assert fake_model(fake).complete(request(user("q"), _calc_call())).text == "echo: q"
    fake.reset()
    assert fake.strict  # reset restores the strict default
