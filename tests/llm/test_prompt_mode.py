"""SPEC M-7 prompt mode, pure parts: the anchored 0:/1: parser, history rewriting, the gate."""

from __future__ import annotations

import json

import pytest

from shared.agent.arguments import ArgumentsError, parse_arguments
from shared.agent.messages import Message, ToolCall
from shared.llm.prompt_mode import (
    INVALID_CALL_NAME,
    PromptDeltaGate,
    parse_prompt_reply,
    render_call,
    to_prompt_messages,
)

from .helpers import CALC


def test_answer_prefix_is_stripped() -> None:
    # SPEC M-7
    assert parse_prompt_reply("  0: The answer is 4.", "c").answer == "The answer is 4."
    assert parse_prompt_reply("0：全角", "c").answer == "全角"


def test_tool_call_prefix() -> None:
    # SPEC M-7
    text = '\n1: {"name": "calculator", "arguments": {"expression": "2+2"}}'
    parsed = parse_prompt_reply(text, "call_x")
    assert parsed.call == ToolCall("call_x", "calculator", '{"expression": "2+2"}')
    assert parsed.error is None and parsed.answer == ""


@pytest.mark.parametrize(
    "text",
    [
        "Step 1: open the door",
        "10:30 is the time",
        "The score was 1:0",
        "0.5 is half",
        "1",
        'Answer:\n1: {"name": "calculator"}',
    ],
)
def test_only_an_anchored_prefix_counts(text: str) -> None:
    # SPEC M-7: FastGPT's unanchored match took these for the protocol
    parsed = parse_prompt_reply(text, "c")
    assert parsed.call is None and parsed.answer == text.strip()


def test_tolerant_json_and_fences() -> None:
    fenced = '1: ```json\n{"name": "calculator", "arguments": {"expression": "1"}}\n```'
    assert parse_prompt_reply(fenced, "c").call == ToolCall(
        "c", "calculator", '{"expression": "1"}'
    )
    json5ish = "1: {'name': 'calculator', 'arguments': {'expression': '3',},}"
    assert parse_prompt_reply(json5ish, "c").call == ToolCall(
        "c", "calculator", '{"expression": "3"}'
    )


def test_parameters_key_and_string_arguments() -> None:
    call = parse_prompt_reply('1: {"name": "f", "parameters": {"a": 1}}', "c").call
    assert call == ToolCall("c", "f", '{"a": 1}')
    call = parse_prompt_reply('1: {"name": "f", "arguments": "{\\"a\\": 1}"}', "c").call
    assert call == ToolCall("c", "f", '{"a": 1}')
    assert parse_prompt_reply('1: {"name": "f"}', "c").call == ToolCall("c", "f", "{}")


def test_unparseable_call_becomes_an_invalid_arguments_call() -> None:
    # SPEC M-7: reported to the model as a tool-call error; the loop continues
    text = '1: {"name": "calculator", "arguments": {"expression": "2+2"'
    parsed = parse_prompt_reply(text, "c")
    assert parsed.call is not None and parsed.call.name == "calculator"
    assert parsed.error
    with pytest.raises(ArgumentsError):  # the loop's reader says "Invalid arguments"
        parse_arguments(parsed.call.arguments)


@pytest.mark.parametrize("text", ["1: call the calculator please", '1: {"tool": "x"}', "1:"])
def test_call_without_a_name_uses_the_invalid_name(text: str) -> None:
    parsed = parse_prompt_reply(text, "c")
    assert parsed.call is not None and parsed.call.name == INVALID_CALL_NAME
    assert parsed.error


def test_without_tools_offered_a_one_prefix_is_text() -> None:
    parsed = parse_prompt_reply("1: first item", "c", tools_offered=False)
    assert parsed.call is None and parsed.answer == "1: first item"
    assert parse_prompt_reply("0: fine", "c", tools_offered=False).answer == "fine"


def test_render_call_round_trips() -> None:
    call = ToolCall("id", "calculator", '{"expression": "2*3"}')
    assert parse_prompt_reply(render_call(call), "id").call == call


def test_history_rewrite() -> None:
    # SPEC M-7: assistant tool calls → `1: {...}`, tool results → user <tool_response> turns
    history = [
        Message(role="system", content="Be brief."),
        Message(role="user", content="2+2 and 3*3?"),
        Message(
            role="assistant",
            content="",
            tool_calls=(
                ToolCall("a", "calculator", '{"expression": "2+2"}'),
                ToolCall("b", "calculator", '{"expression": "3*3"}'),
            ),
        ),
        Message(role="tool", content="4", tool_call_id="a", name="calculator"),
        Message(role="tool", content="9", tool_call_id="b"),
        Message(role="assistant", content="4 and 9."),
        Message(role="user", content="thanks"),
    ]
    out = to_prompt_messages(history, [CALC])
    roles = [m.role for m in out]
    assert roles == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    assert out[0].text.startswith("Be brief.\n\n") and '"name": "calculator"' in out[0].text
    assert json.loads(out[2].text[3:]) == {"name": "calculator", "arguments": {"expression": "2+2"}}
    assert out[3].text == '<tool_response name="calculator">\n4\n</tool_response>'
    assert out[5].text == '<tool_response name="calculator">\n9\n</tool_response>'
    assert out[6].text == "0: 4 and 9."
    assert all(not m.tool_calls and m.role != "tool" for m in out)


def test_system_prompt_added_when_missing_and_adjacent_users_merged() -> None:
    history = [
        Message(role="tool", content="orphan", tool_call_id="z"),
        Message(role="user", content="next"),
    ]
    out = to_prompt_messages(history, [CALC])
    assert [m.role for m in out] == ["system", "user"]
    assert out[1].text == "<tool_response>\norphan\n</tool_response>\n\nnext"


def test_tool_result_cannot_close_the_tag_early() -> None:
    history = [Message(role="tool", content="x</tool_response>y", tool_call_id="a")]
    out = to_prompt_messages(history, [])
    assert out[0].text.count("</tool_response>") == 1


def _gate(pieces: list[str], tools: bool = True) -> str:
    gate = PromptDeltaGate(tools_offered=tools)
    return "".join(gate.push(p) for p in pieces) + gate.finish()


@pytest.mark.parametrize(
    ("pieces", "shown"),
    [
        (["0", ":", " Hel", "lo"], "Hello"),
        (["  0: ", " ", "x"], "x"),
        (["1", ': {"name"', ": 1}"], ""),
        (["1", "0:30 now"], "10:30 now"),
        (["Step 1: go"], "Step 1: go"),
        (["1"], "1"),
        (["", " "], " "),
    ],
)
def test_delta_gate(pieces: list[str], shown: str) -> None:
    # SPEC M-7: listeners see the answer only, never the protocol or a call's JSON
    assert _gate(pieces) == shown


def test_delta_gate_without_tools_streams_a_one_prefix() -> None:
    assert _gate(["1: ", "item"], tools=False) == "1: item"
