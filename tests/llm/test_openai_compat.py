"""The client's turn logic over MockTransport: SPEC M-6 (tools rejected), M-7 (auto mode),
M-9 (estimated usage), M-10 (length continuation), total timeout, non-streaming mode."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from shared.agent.messages import ToolCall, Usage
from shared.errors import FatalModelError, ToolsRejected, TransientModelError
from shared.llm.base import Delta
from shared.llm.openai_compat import CONTINUE_PROMPT
from shared.llm.tool_modes import ToolModes

from .helpers import CALC, SSE_DIR, mock_model, profile, request, sse_response, user


def sse(*chunks: dict[str, Any], done: bool = True) -> bytes:
    out = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
    return out + (b"data: [DONE]\n\n" if done else b"")


def text_chunk(text: str, finish: str | None = None, usage: dict | None = None) -> dict:
    chunk: dict[str, Any] = {
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]
    }
    if usage:
        chunk["usage"] = usage
    return chunk


def rejected(message: str = "tools are not supported") -> httpx.Response:
    return httpx.Response(400, json={"error": {"message": message}})


class Script:
    """A MockTransport handler replying from a list, recording the bodies it got."""

    def __init__(self, *responses: httpx.Response) -> None:
        self.responses = list(responses)
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, req: httpx.Request) -> httpx.Response:
        self.bodies.append(json.loads(req.content))
        return self.responses.pop(0)


# SPEC M-6 ---------------------------------------------------------------------------


def test_400_with_tools_resends_once_without_tools() -> None:
    # SPEC M-6
    script = Script(rejected(), sse_response(sse(text_chunk("plain answer", "stop"))))
    model = mock_model(script, tool_mode="native")
    reply = model.complete(request(tools=(CALC,), tool_choice="auto"))
    assert reply.text == "plain answer" and reply.tool_calls == ()
    assert "tools_rejected" in reply.extra
    assert "tools" in script.bodies[0] and "tool_choice" in script.bodies[0]
    assert "tools" not in script.bodies[1] and "tool_choice" not in script.bodies[1]
    assert model.tool_modes.get(model.profile) is None  # only `auto` learns


def test_when_the_resend_fails_too_the_first_400_is_raised() -> None:
    # SPEC M-6: the first 400 is the closer cause
    script = Script(rejected("first: tools"), rejected("second: other"))
    with pytest.raises(ToolsRejected, match="first: tools") as info:
        mock_model(script, tool_mode="native").complete(request(tools=(CALC,)))
    assert "second: other" in str(info.value.__cause__)
    assert len(script.bodies) == 2


def test_a_transient_failure_of_the_resend_stays_retryable() -> None:
    # SPEC M-6 + M-8 (documented choice): a 503 on the resend is raised so the round retries
    script = Script(rejected(), httpx.Response(503, json={"error": {"message": "down"}}))
    with pytest.raises(TransientModelError, match="down"):
        mock_model(script, tool_mode="native").complete(request(tools=(CALC,)))


def test_400_without_tools_is_fatal_and_not_resent() -> None:
    # SPEC M-6 applies to requests that carry tools only
    script = Script(rejected("bad request"))
    with pytest.raises(FatalModelError) as info:
        mock_model(script).complete(request())
    assert not isinstance(info.value, ToolsRejected) and len(script.bodies) == 1


def test_function_mode_400_resends_without_functions() -> None:
    script = Script(rejected(), sse_response(sse(text_chunk("ok", "stop"))))
    mock_model(script, tool_mode="function").complete(request(tools=(CALC,)))
    assert "functions" in script.bodies[0] and "functions" not in script.bodies[1]


# SPEC M-7 auto ----------------------------------------------------------------------


def test_auto_falls_back_to_prompt_mode_and_remembers() -> None:
    # SPEC M-7: auto = native, then prompt mode when tools are rejected, remembered
    call = '1: {"name": "calculator", "arguments": {"expression": "6*7"}}'
    script = Script(
        rejected(),
        sse_response(sse(text_chunk(call, "stop"))),
        sse_response(sse(text_chunk("0: 42", "stop"))),
    )
    model = mock_model(script, tool_mode="auto", name="local")
    first = model.complete(request(user("6*7?"), tools=(CALC,)))
    assert first.tool_calls[0].name == "calculator"
    assert json.loads(first.tool_calls[0].arguments) == {"expression": "6*7"}
    assert first.finish_reason == "tool_calls" and first.extra["tool_mode"] == "prompt"
    assert model.tool_modes.get(model.profile) == "prompt"
    assert (
        "tools" not in script.bodies[1] and "<tools>" in script.bodies[1]["messages"][0]["content"]
    )

    second = model.complete(request(user("again"), tools=(CALC,)))  # straight to prompt mode
    assert second.text == "42" and second.tool_calls == ()
    assert len(script.bodies) == 3 and "tools" not in script.bodies[2]


def test_auto_does_not_remember_when_the_prompt_resend_fails() -> None:
    script = Script(rejected("closer cause"), rejected("unrelated"))
    model = mock_model(script, tool_mode="auto")
    with pytest.raises(ToolsRejected, match="closer cause"):
        model.complete(request(tools=(CALC,)))
    assert model.tool_modes.get(model.profile) is None


def test_remembered_modes_are_per_profile_and_clearable() -> None:
    a, b = profile(name="a"), profile(name="b")
    modes = ToolModes()
    modes.remember(a, "prompt")
    assert modes.get(a) == "prompt" and modes.get(b) is None
    assert modes.get(profile(name="a", base_url="http://other/v1")) is None
    modes.clear()
    assert modes.get(a) is None


def test_remembering_is_thread_safe() -> None:
    profiles = [profile(name=f"p{i}") for i in range(50)]
    modes = ToolModes()
    threads = [threading.Thread(target=modes.remember, args=(p, "prompt")) for p in profiles]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(modes.get(p) == "prompt" for p in profiles)


def test_prompt_mode_streams_only_the_answer() -> None:
    # SPEC M-7: the 0: prefix is not shown; reasoning passes through
    chunks = [
        {"choices": [{"index": 0, "delta": {"reasoning_content": "hm"}}]},
        text_chunk("0"),
        text_chunk(": Hi"),
        text_chunk(" there", "stop"),
    ]
    deltas: list[Delta] = []
    model = mock_model(Script(sse_response(sse(*chunks))), tool_mode="prompt")
    reply = model.complete(request(tools=(CALC,)), deltas.append)
    assert reply.text == "Hi there" and reply.reasoning == "hm"
    assert "".join(d.text for d in deltas if d.kind == "text") == "Hi there"


def test_prompt_mode_invalid_call_is_reported_in_extra() -> None:
    # SPEC M-7: a `1:` whose JSON cannot be parsed → a call the loop reports as invalid
    body = sse(text_chunk('1: {"name": "calculator", "arguments": {oops', "stop"))
    reply = mock_model(Script(sse_response(body)), tool_mode="prompt").complete(
        request(tools=(CALC,))
    )
    assert reply.tool_calls[0].name == "calculator" and "prompt_error" in reply.extra


def test_prompt_mode_call_ids_are_stable_for_the_same_reply() -> None:
    call = sse(text_chunk('1: {"name": "calculator", "arguments": {}}', "stop"))
    ids = [
        mock_model(Script(sse_response(call)), tool_mode="prompt")
        .complete(request(tools=(CALC,)))
        .tool_calls[0]
        .id
        for _ in range(2)
    ]
    assert ids[0] == ids[1] and ids[0].startswith("call_")


# SPEC M-10 --------------------------------------------------------------------------


def test_length_continues_up_to_max_continuations() -> None:
    # SPEC M-10
    usage = {"prompt_tokens": 10, "completion_tokens": 5}
    script = Script(
        sse_response(sse(text_chunk("Once upon", "length", usage))),
        sse_response(sse(text_chunk(" a time", "length", usage))),
        sse_response(sse(text_chunk(" there", "length", usage))),
    )
    reply = mock_model(script, max_continuations=2).complete(request(user("story")))
    assert reply.text == "Once upon a time there" and reply.finish_reason == "length"
    assert len(script.bodies) == 3
    tail = script.bodies[2]["messages"][-2:]
    assert tail == [
        {"role": "assistant", "content": "Once upon a time"},
        {"role": "user", "content": CONTINUE_PROMPT},
    ]
    assert reply.usage == Usage(30, 15)
    assert reply.extra["continuations"] == 2 and len(reply.extra["call_usages"]) == 3


def test_no_continuation_by_default_or_with_tool_calls() -> None:
    # SPEC M-10: default 0; never when the reply carries tool calls
    script = Script(sse_response(sse(text_chunk("cut", "length"))))
    assert mock_model(script).complete(request()).text == "cut"
    assert len(script.bodies) == 1
    tool = {"index": 0, "id": "t", "function": {"name": "calculator", "arguments": "{}"}}
    chunk = {"choices": [{"index": 0, "delta": {"tool_calls": [tool]}, "finish_reason": "length"}]}
    script = Script(sse_response(sse(chunk)))
    reply = mock_model(script, max_continuations=3).complete(request(tools=(CALC,)))
    assert reply.tool_calls == (ToolCall("t", "calculator", "{}"),) and len(script.bodies) == 1


# SPEC M-9 usage ---------------------------------------------------------------------


def test_missing_usage_is_estimated_and_marked() -> None:
    # SPEC M-9
    script = Script(sse_response(sse(text_chunk("a reply of some words", "stop"))))
    usage = mock_model(script).complete(request(user("x" * 400))).usage
    assert usage is not None and usage.estimated
    assert usage.input_tokens >= 100 and usage.output_tokens > 0


def test_reported_usage_is_not_estimated() -> None:
    body = sse(
        text_chunk("x", "stop"),
        {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}},
    )
    usage = mock_model(Script(sse_response(body))).complete(request()).usage
    assert usage == Usage(7, 3)


# streaming details ------------------------------------------------------------------


def test_end_of_body_without_done_ends_the_stream() -> None:
    # SPEC M-2
    reply = mock_model(Script(sse_response(sse(text_chunk("fine", "stop"), done=False)))).complete(
        request()
    )
    assert reply.text == "fine" and reply.extra["done"] is False


def test_events_after_done_are_ignored() -> None:
    body = sse(text_chunk("a", "stop")) + sse(text_chunk("b"))
    assert mock_model(Script(sse_response(body))).complete(request()).text == "a"


def test_json_reply_to_a_streaming_request_is_accepted() -> None:
    completion = {
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "whole"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 2, "completion_tokens": 1},
    }
    reply = mock_model(Script(httpx.Response(200, json=completion))).complete(request())
    assert reply.text == "whole" and reply.usage == Usage(2, 1)


def test_non_streaming_profile_posts_and_parses_json() -> None:
    completion = {
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "x",
                            "type": "function",
                            "function": {"name": "calculator", "arguments": "{}"},
                        }
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ]
    }
    script = Script(httpx.Response(200, json=completion))
    deltas: list[Delta] = []
    reply = mock_model(script, stream=False).complete(request(tools=(CALC,)), deltas.append)
    assert script.bodies[0]["stream"] is False and "stream_options" not in script.bodies[0]
    assert reply.tool_calls == (ToolCall("x", "calculator", "{}"),)
    assert reply.usage is not None and reply.usage.estimated
    assert [d.kind for d in deltas] == ["tool"]


def test_total_timeout_is_a_deadline_while_streaming() -> None:
    # SPEC M-8: every call has a total timeout; a trickle of comments cannot outlive it
    def trickle() -> Iterator[bytes]:
        yield sse(text_chunk("start"), done=False)
        while True:
            time.sleep(0.02)
            yield b": still here\n\n"

    def handler(_: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=trickle(), headers={"content-type": "text/event-stream"})

    started = time.monotonic()
    with pytest.raises(TransientModelError, match="total timeout"):
        mock_model(handler, timeout_total=0.3).complete(request())
    assert time.monotonic() - started < 2


def test_deltas_are_forwarded_while_streaming() -> None:
    body = sse(text_chunk("a"), text_chunk("b", "stop"))
    deltas: list[Delta] = []
    mock_model(Script(sse_response(body))).complete(request(), deltas.append)
    assert deltas == [Delta(kind="text", text="a"), Delta(kind="text", text="b")]


# SPEC M-7: only a 400 about tools switches an auto profile, and the switch expires ---------


def _auto(script: Script, modes: ToolModes | None = None) -> Any:
    model = mock_model(script, tool_mode="auto", name="local")
    if modes is not None:
        model.tool_modes = modes
    return model


OK = "0: fine"


def test_a_400_not_about_tools_does_not_switch_the_profile() -> None:
    script = Script(
        rejected("This model's maximum context length is 8192 tokens"),
        sse_response(sse(text_chunk(OK, "stop"))),
        sse_response(sse(text_chunk("native again", "stop"))),
    )
    model = _auto(script)
    assert model.complete(request(tools=(CALC,))).text == "fine"  # M-6's one resend
    assert model.tool_modes.get(model.profile) is None
    model.complete(request(tools=(CALC,)))
    assert "tools" in script.bodies[2]  # the next turn tries native tools again


@pytest.mark.parametrize(
    "body",
    [
        {"error": {"message": "registry.ollama.ai/library/gemma3:4b does not support tools"}},
        {"error": "model does not support tools"},  # Ollama's native shape
        {"error": {"message": "bad request", "param": "tools"}},
        {"error": {"message": '"auto" tool choice requires --enable-auto-tool-choice'}},
    ],
)
def test_a_400_about_tools_switches_the_profile(body: dict[str, Any]) -> None:
    script = Script(httpx.Response(400, json=body), sse_response(sse(text_chunk(OK, "stop"))))
    model = _auto(script)
    model.complete(request(tools=(CALC,)))
    assert model.tool_modes.get(model.profile) == "prompt"


def test_a_tool_call_the_model_got_wrong_is_not_about_tool_support() -> None:
    # Groq's tool_use_failed (a recorded body): the endpoint takes tools
    raw = (SSE_DIR / "errors" / "groq_400_tool_use_failed.json").read_bytes()
    script = Script(httpx.Response(400, content=raw), sse_response(sse(text_chunk(OK, "stop"))))
    model = _auto(script)
    model.complete(request(tools=(CALC,)))
    assert model.tool_modes.get(model.profile) is None


def test_the_switch_to_prompt_mode_expires() -> None:
    now = [1000.0]
    modes = ToolModes(ttl_s=600, clock=lambda: now[0])
    script = Script(
        rejected("does not support tools"),
        sse_response(sse(text_chunk(OK, "stop"))),
        sse_response(sse(text_chunk(OK, "stop"))),
        sse_response(sse(text_chunk("native", "stop"))),
    )
    model = _auto(script, modes)
    model.complete(request(tools=(CALC,)))
    now[0] += 599
    model.complete(request(tools=(CALC,)))
    assert "tools" not in script.bodies[2]  # still prompt mode
    now[0] += 2
    assert modes.get(model.profile) is None
    assert model.complete(request(tools=(CALC,))).text == "native"
    assert "tools" in script.bodies[3]  # expired: native tools again


def test_the_runtime_holds_the_learnt_modes(sqlite_rt: Any) -> None:
    from dataclasses import replace

    modes = sqlite_rt.tool_modes
    assert modes.ttl_s == sqlite_rt.settings.tool_mode_ttl_s
    assert replace(sqlite_rt, publish=lambda items: None).tool_modes is modes  # shared by copies
