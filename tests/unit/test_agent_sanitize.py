"""Poison replies made storable (``shared.agent.sanitize``): repeated, over-long and NUL ids,
NUL in names, arguments, reasoning and text."""

from __future__ import annotations

from shared.agent.messages import Reply, ToolCall
from shared.agent.sanitize import MAX_ID_CHARS, poison_reason, sanitize_reply, unique_call_ids


def _reply(*ids: str, name: str = "calculator", text: str = "ok") -> Reply:
    calls = tuple(ToolCall(id=i, name=name, arguments='{"x": 1}') for i in ids)
    return Reply(text=text, tool_calls=calls, finish_reason="tool_calls")


def test_ids_repeated_within_a_reply_and_across_rounds_become_unique() -> None:
    got = sanitize_reply(_reply("call_1", "call_1", "call_2"), used_ids={"call_2"})
    ids = [c.id for c in got.tool_calls]
    assert ids == ["call_1", "call_1_2", "call_2_2"]
    assert len(set(ids) | {"call_2"}) == 4


def test_ordinary_ids_are_kept_as_they_are() -> None:
    reply = _reply("call_abc", "toolu_01XyZ")
    assert sanitize_reply(reply, used_ids={"call_old"}) == reply


def test_long_and_control_character_ids_are_cut_but_stay_distinct() -> None:
    long_a, long_b = "a" * 500, "a" * 499 + "b"
    ids = unique_call_ids([long_a, long_b, "x\x00y", "xy", "", ""])
    assert all(len(i) <= MAX_ID_CHARS for i in ids)
    assert len(set(ids)) == len(ids)
    assert all("\x00" not in i for i in ids)
    assert ids[3] == "xy" and ids[4] == "call_4" and ids[5] == "call_5"


def test_suffixes_fit_the_length_limit() -> None:
    full = "c" * MAX_ID_CHARS
    ids = unique_call_ids([full] * 12, used=[full])
    assert all(len(i) == MAX_ID_CHARS for i in ids) and len(set(ids) | {full}) == 13


def test_nul_is_dropped_from_text_and_marked_in_names_and_arguments() -> None:
    reply = Reply(
        text="an\x00swer",
        reasoning="th\x00ink",
        tool_calls=(ToolCall(id="c\x001", name="calc\x00ulator", arguments='{"a": "\x00"}'),),
        raw_model="m\x00",
    )
    got = sanitize_reply(reply)
    assert (got.text, got.reasoning, got.raw_model) == ("answer", "think", "m")
    [call] = got.tool_calls
    assert call.name == "calc\ufffdulator"  # stays unknown: never silently another tool
    assert call.arguments == '{"a": "\ufffd"}'
    assert "\x00" not in call.id and len(call.id) <= MAX_ID_CHARS


def test_deterministic() -> None:
    reply = _reply("dup", "dup", "z" * 300)
    assert sanitize_reply(reply, used_ids=["dup"]) == sanitize_reply(reply, used_ids=["dup"])


def test_poison_reasons() -> None:
    assert poison_reason(_reply("a", "b"), used_ids=["c"]) is None
    assert "repeated in the reply" in str(poison_reason(_reply("a", "a")))
    assert "already used" in str(poison_reason(_reply("a"), used_ids=["a"]))
    assert "over 128" in str(poison_reason(_reply("x" * 129)))
    assert "control characters" in str(poison_reason(_reply("a\x00")))
    assert "tool name" in str(poison_reason(_reply("a", name="calc\x00")))
    assert "tool name" in str(poison_reason(_reply("a", name="n" * 129)))
    assert len(sanitize_reply(_reply("a", name="n" * 300)).tool_calls[0].name) == 128
