"""SPEC L-3 on the pure step: the counters after each reply and the next ``tool_choice``."""

from __future__ import annotations

import json

import pytest

from shared.agent.messages import Reply, ToolCall
from shared.agent.spec import AgentSpec
from shared.agent.state import CatalogEntry, LoopState
from shared.agent.step import next_tool_choice, step

CATALOG = {"calc": CatalogEntry("calc", read_only=True)}


def _reply(expr: str, text: str = "") -> Reply:
    return Reply(text=text, tool_calls=(ToolCall(f"c_{expr}", "calc", json.dumps({"e": expr})),))


def _choices(spec: AgentSpec, replies: list[Reply]) -> list[str | None]:
    """``tool_choice`` of the request after each reply."""
    state, out = LoopState(), []
    for reply in replies:
        state = step(spec, state, reply, CATALOG).state
        out.append(next_tool_choice(spec, state))
    return out


@pytest.mark.parametrize(
    ("replies", "expected"),
    [
        # 3 tool-only rounds exceed force_answer_after=2
        ([_reply("1"), _reply("2"), _reply("3")], [None, None, "none"]),
        # answer text in a round resets the tool-only count
        ([_reply("1"), _reply("2", "hm"), _reply("3"), _reply("4")], [None, None, None, None]),
        # 3 identical rounds, text or not
        ([_reply("1", "a"), _reply("1", "b"), _reply("1", "c")], [None, None, "none"]),
        # a different call breaks the identical streak
        ([_reply("1", "a"), _reply("1", "b"), _reply("2", "c"), _reply("2", "d")], [None] * 4),
    ],
    ids=["tool-only", "text-resets", "identical", "streak-broken"],
)
def test_anti_loop_counters(replies: list[Reply], expected: list[str | None]) -> None:
    assert _choices(AgentSpec(kind="agent", force_answer_after=2), replies) == expected


def test_same_arguments_in_another_key_order_are_identical() -> None:
    spec = AgentSpec(kind="agent", force_answer_after=50)
    a = Reply(tool_calls=(ToolCall("x", "calc", '{"a": 1, "b": 2}'),))
    b = Reply(tool_calls=(ToolCall("y", "calc", '{"b": 2, "a": 1}'),))
    assert _choices(spec, [a, b, a]) == [None, None, "none"]
