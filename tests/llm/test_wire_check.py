"""The strict transcript rule of the model doubles (as OpenAI enforces it)."""

from __future__ import annotations

from typing import Any

import pytest

from shared.agent.messages import Message, ToolCall
from shared.errors import FatalModelError
from shared.llm.base import ModelRequest
from shared.llm.scripted import DemoModel, ScriptedModel
from shared.llm.wire_check import DANGLING_PREFIX, ORPHAN_TOOL_MESSAGE, transcript_problem


def _asst(*ids: str) -> dict[str, Any]:
    calls = [
        {"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in ids
    ]
    return {"role": "assistant", "content": None, "tool_calls": calls}


def _tool(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "content": "ok", "tool_call_id": call_id}


U = {"role": "user", "content": "q"}
A = {"role": "assistant", "content": "done"}

CASES = [
    ("no tools", [U, A, U], None),
    ("answered in any order", [U, _asst("a", "b"), _tool("b"), _tool("a"), A], None),
    ("ends on a call", [U, _asst("a")], (2, DANGLING_PREFIX + "a")),
    ("one of two missing", [U, _asst("a", "b"), _tool("a"), U], (3, DANGLING_PREFIX + "b")),
    ("a user turn in between", [U, _asst("a"), U, _tool("a")], (2, DANGLING_PREFIX + "a")),
    ("tool without a call", [U, _tool("a")], (1, ORPHAN_TOOL_MESSAGE)),
    ("answered twice", [U, _asst("a"), _tool("a"), _tool("a")], (3, ORPHAN_TOOL_MESSAGE)),
    (
        "answer to an older call",
        [U, _asst("a"), _tool("a"), _asst("b"), _tool("a")],
        (4, ORPHAN_TOOL_MESSAGE),
    ),
]


@pytest.mark.parametrize(
    ("messages", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_transcript_problem(
    messages: list[dict[str, Any]], expected: tuple[int, str] | None
) -> None:
    assert transcript_problem(messages) == expected


@pytest.mark.parametrize(
    "model", [ScriptedModel([{"text": "hi"}]), DemoModel()], ids=["scripted", "demo"]
)
def test_offline_models_are_strict_too(model: ScriptedModel | DemoModel) -> None:
    call = Message(role="assistant", tool_calls=(ToolCall("c1", "f", "{}"),))
    with pytest.raises(FatalModelError, match="did not have response messages: c1") as err:
        model.complete(ModelRequest(messages=(Message(role="user", content="q"), call)))
    assert err.value.status == 400
    blank = Message(role="user", content="  ")  # never sent (SPEC M-5), so not in the way
    answer = Message(role="tool", content="1", tool_call_id="c1")
    model.complete(ModelRequest(messages=(Message(role="user", content="q"), call, blank, answer)))
