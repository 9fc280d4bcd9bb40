"""The pure stream accumulator: SPEC M-2 (error chunks), M-3 (deltas), M-4 (tool calls)."""

from __future__ import annotations

from typing import Any

import pytest

from shared.agent.messages import ToolCall, Usage
from shared.errors import FatalModelError, ModelError, TransientModelError
from shared.llm.base import Delta
from shared.llm.stream import StreamAccumulator, reply_from_completion


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **top: Any) -> dict:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {"object": "chat.completion.chunk", "choices": choices, **top}


def tool(
    index: int | None, id: str | None = None, name: str | None = None, args: str | None = None
):
    function: dict[str, Any] = {}
    if name is not None:
        function["name"] = name
    if args is not None:
        function["arguments"] = args
    raw: dict[str, Any] = {"function": function}
    if index is not None:
        raw["index"] = index
    if id is not None:
        raw["id"] = id
    return chunk({"tool_calls": [raw]})


def assemble(*chunks: dict) -> StreamAccumulator:
    acc = StreamAccumulator()
    for c in chunks:
        acc.feed(c)
    return acc


# SPEC M-3 ---------------------------------------------------------------------------


def test_text_from_string_content() -> None:
    # SPEC M-3
    acc = StreamAccumulator()
    assert acc.feed(chunk({"role": "assistant", "content": ""})) == []
    assert acc.feed(chunk({"content": "Hel"})) == [Delta(kind="text", text="Hel")]
    acc.feed(chunk({"content": "lo"}, finish="stop"))
    reply = acc.result()
    assert (reply.text, reply.finish_reason, reply.tool_calls) == ("Hello", "stop", ())


def test_content_parts_thinking_is_reasoning_text_is_answer() -> None:
    # SPEC M-3 (Mistral magistral shape)
    thinking = {"type": "thinking", "thinking": [{"type": "text", "text": "hmm"}]}
    acc = StreamAccumulator()
    deltas = acc.feed(chunk({"content": [thinking, {"type": "text", "text": "A"}]}))
    assert deltas == [Delta(kind="reasoning", text="hmm"), Delta(kind="text", text="A")]
    acc.feed(chunk({"content": "B"}))
    assert (acc.result().reasoning, acc.result().text) == ("hmm", "AB")


@pytest.mark.parametrize("key", ["reasoning_content", "reasoning"])
def test_reasoning_keys(key: str) -> None:
    # SPEC M-3
    acc = assemble(chunk({key: "think "}), chunk({key: "more"}), chunk({"content": "x"}))
    assert acc.result().reasoning == "think more"


def test_reasoning_sent_under_both_keys_counts_once() -> None:
    # SPEC M-3: vLLM-style servers repeat the text under both keys
    acc = assemble(chunk({"reasoning_content": "r", "reasoning": "r"}))
    assert acc.result().reasoning == "r"


def test_empty_choices_and_usage_last_wins() -> None:
    # SPEC M-3: usage-only chunks and prompt-filter chunks with empty choices are fine
    first = {"prompt_tokens": 1, "completion_tokens": 1}
    last = {
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 4},
    }
    acc = assemble(
        chunk(None, prompt_filter_results=[]),
        chunk({"content": "x"}, usage=first),
        chunk({"content": "y"}, usage=None),
        chunk(None, usage=last),
    )
    assert acc.result().usage == Usage(input_tokens=10, output_tokens=5, cached_input_tokens=4)


def test_no_usage_is_none() -> None:
    # SPEC M-9: the client estimates when the stream had none
    assert assemble(chunk({"content": "x"})).result().usage is None


def test_deepseek_cache_hit_tokens() -> None:
    usage = {"prompt_tokens": 9, "completion_tokens": 1, "prompt_cache_hit_tokens": 8}
    assert assemble(chunk(None, usage=usage)).result().usage == Usage(9, 1, 8)


def test_finish_reason_last_non_null() -> None:
    # SPEC M-3/M-4
    acc = assemble(chunk({"content": "x"}, finish="length"), chunk({}, finish=None))
    assert acc.result().finish_reason == "length"
    acc.feed(chunk({}, finish="stop"))
    assert acc.result().finish_reason == "stop"


def test_other_choice_indices_are_ignored() -> None:
    acc = StreamAccumulator()
    acc.feed({"choices": [{"index": 1, "delta": {"content": "other"}}]})
    acc.feed({"choices": [{"index": 0, "delta": {"content": "mine"}}]})
    assert acc.result().text == "mine"


# SPEC M-4 ---------------------------------------------------------------------------


def test_tool_index_need_not_start_at_zero() -> None:
    # SPEC M-4
    acc = assemble(tool(3, "c3", "read", '{"a":'), tool(3, args="1}"))
    assert acc.result().tool_calls == (ToolCall("c3", "read", '{"a":1}'),)


def test_interleaved_indices() -> None:
    # SPEC M-4 — synthesized: no real recording interleaves (fixtures/sse/INDEX.md)
    acc = assemble(
        tool(1, "b", "second", '{"y"'),
        tool(0, "a", "first", '{"x"'),
        tool(1, args=": 2}"),
        tool(0, args=": 1}"),
    )
    assert acc.result().tool_calls == (
        ToolCall("a", "first", '{"x": 1}'),
        ToolCall("b", "second", '{"y": 2}'),
    )


def test_first_non_empty_id_is_kept() -> None:
    # SPEC M-4: later "" or repeated/different ids never overwrite it
    acc = assemble(tool(0, "", "f"), tool(0, "real"), tool(0, ""), tool(0, "other", args="{}"))
    assert acc.result().tool_calls[0].id == "real"


def test_name_rules() -> None:
    # SPEC M-4: "" never replaces; a later non-empty different name does
    acc = assemble(tool(0, "i", "first"), tool(0, name=""), tool(0, name="first"))
    assert acc.result().tool_calls[0].name == "first"
    acc.feed(tool(0, name="renamed"))
    assert acc.result().tool_calls[0].name == "renamed"


def test_empty_arguments_and_missing_id_defaults() -> None:
    # SPEC M-4: empty arguments → "{}", missing id → call_{index}
    acc = assemble(tool(2, name="now", args=""), tool(2, args=""))
    assert acc.result().tool_calls == (ToolCall("call_2", "now", "{}"),)


def test_tool_calls_ordered_by_index() -> None:
    # SPEC M-4
    acc = assemble(tool(5, "e", "e"), tool(1, "a", "a"), tool(3, "c", "c"))
    assert [c.id for c in acc.result().tool_calls] == ["a", "c", "e"]


def test_tool_deltas_report_progress() -> None:
    acc = StreamAccumulator()
    assert acc.feed(tool(0, "i", "calc", "")) == [Delta(kind="tool", index=0, name="calc")]
    assert acc.feed(tool(0, args='{"x"')) == [Delta(kind="tool", index=0, name="calc", text='{"x"')]
    assert acc.feed(tool(0, id="i")) == []


def test_missing_index_opens_a_call_per_new_id() -> None:
    # Gemini's endpoint omits tool_calls[].index (openai/openai-python#2806) — synthesized
    acc = assemble(tool(None, "a", "f", "{}"), tool(None, "b", "g", '{"k"'), tool(None, args=":1}"))
    assert acc.result().tool_calls == (ToolCall("a", "f", "{}"), ToolCall("b", "g", '{"k":1}'))


def test_legacy_function_call_delta() -> None:
    # SPEC M-7 function mode: one call, index 0
    acc = assemble(
        chunk({"function_call": {"name": "calc", "arguments": ""}}),
        chunk({"function_call": {"arguments": '{"e": "1"}'}}, finish="function_call"),
    )
    assert acc.result().tool_calls == (ToolCall("call_0", "calc", '{"e": "1"}'),)


# SPEC M-2: errors inside the stream ---------------------------------------------------


def test_error_chunk_raises_typed_error_with_message() -> None:
    # SPEC M-2: never an empty success
    acc = assemble(chunk({"content": "partial"}))
    with pytest.raises(FatalModelError, match="Token limit reached") as info:
        acc.feed({"error": {"code": 400, "message": "Token limit reached"}, "choices": []})
    assert info.value.status == 400


@pytest.mark.parametrize(
    ("error", "kind", "status"),
    [
        ({"message": "slow down", "code": 429}, TransientModelError, 429),
        ({"message": "oops", "status_code": 503}, TransientModelError, 503),
        ({"message": "The server had an error", "type": "server_error"}, TransientModelError, None),
        ({"message": "bad", "type": "invalid_request_error"}, FatalModelError, None),
        ({"message": "bad", "code": "tool_use_failed", "status_code": 400}, FatalModelError, 400),
    ],
)
def test_error_chunk_status_mapping(
    error: dict, kind: type[ModelError], status: int | None
) -> None:
    # SPEC M-8 applied to in-stream errors
    with pytest.raises(kind) as info:
        StreamAccumulator().feed({"error": error})
    assert info.value.status == status
    assert error["message"] in str(info.value)


def test_non_streaming_completion() -> None:
    body = {
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "hi",
                    "reasoning_content": "r",
                    "tool_calls": [
                        {"id": "a", "type": "function", "function": {"name": "f", "arguments": ""}},
                        {
                            "id": "b",
                            "type": "function",
                            "function": {"name": "g", "arguments": "{}"},
                        },
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2},
    }
    reply, deltas = reply_from_completion(body)
    assert reply.text == "hi" and reply.reasoning == "r" and reply.raw_model == "m"
    assert reply.tool_calls == (ToolCall("a", "f", "{}"), ToolCall("b", "g", "{}"))
    assert reply.usage == Usage(3, 2)
    assert [d.kind for d in deltas] == ["reasoning", "text", "tool", "tool"]
