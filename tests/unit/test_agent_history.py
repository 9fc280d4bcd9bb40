"""History trimming (SPEC C-3, the first step of SPEC L-8)."""

from __future__ import annotations

from shared.agent.compression import checkpoint_message
from shared.agent.history import group_turns, request_budget, trim_history
from shared.agent.messages import Message, ToolCall
from shared.agent.tokens import estimate_messages_tokens

SYSTEM = Message(role="system", content="sys")


def _user(text: str) -> Message:
    return Message(role="user", content=text)


def _answer(text: str) -> Message:
    return Message(role="assistant", content=text)


def _turn(name: str, size: int = 10) -> list[Message]:
    return [_user(f"{name} " + "q" * size), _answer(f"{name} " + "a" * size)]


def _tool_turn(name: str, result_size: int = 10) -> list[Message]:
    call = ToolCall(id=f"call_{name}", name="search", arguments="{}")
    return [
        _user(f"{name} question"),
        Message(role="assistant", content="", tool_calls=(call,)),
        Message(role="tool", content="r" * result_size, tool_call_id=call.id, name="search"),
        _answer(f"{name} done"),
    ]


# SPEC C-3 (and L-8: "the request must fit context_window - max_tokens")


def test_request_budget() -> None:
    assert request_budget(128_000, 4096) == 123_904
    assert request_budget(1000, 4000) == 0


def test_everything_fits() -> None:
    msgs = [SYSTEM, *_turn("a"), *_turn("b")]
    assert trim_history(msgs, 10_000) == msgs


def test_oldest_groups_go_first() -> None:
    # SPEC C-3: groups kept newest first while they fit
    a, b, c = _turn("a", 400), _turn("b", 400), _turn("c", 400)
    msgs = [SYSTEM, *a, *b, *c]
    budget = estimate_messages_tokens([SYSTEM, *b, *c]) + 5
    assert trim_history(msgs, budget) == [SYSTEM, *b, *c]


def test_walk_stops_at_the_first_group_that_does_not_fit() -> None:
    # a small old group beyond a big one is not kept: no gap in the middle of the history
    tiny, big, newest = _turn("tiny", 1), _turn("big", 4000), _turn("new", 10)
    msgs = [SYSTEM, *tiny, *big, *newest]
    budget = estimate_messages_tokens([SYSTEM, *tiny, *newest]) + 5
    assert trim_history(msgs, budget) == [SYSTEM, *newest]


def test_newest_group_is_kept_even_when_it_alone_overflows() -> None:
    # SPEC C-3
    old, huge = _turn("old", 10), _turn("huge", 40_000)
    msgs = [SYSTEM, *old, *huge]
    assert trim_history(msgs, 100) == [SYSTEM, *huge]


def test_leading_system_messages_and_checkpoint_always_kept() -> None:
    checkpoint = checkpoint_message("Goal: x " * 500, None)
    sys2 = Message(role="system", content="more rules")
    msgs = [SYSTEM, sys2, checkpoint, *_turn("a", 400), *_turn("b", 10)]
    out = trim_history(msgs, 10)
    assert out[:3] == [SYSTEM, sys2, checkpoint]
    assert out[3:] == msgs[-2:]


def test_a_later_checkpoint_is_kept() -> None:
    checkpoint = checkpoint_message("Goal: x", None)
    msgs = [SYSTEM, *_turn("a", 400), checkpoint, _answer("ok"), *_turn("b", 400)]
    budget = estimate_messages_tokens([SYSTEM, checkpoint, _answer("ok"), *_turn("b", 400)])
    out = trim_history(msgs, budget)
    assert checkpoint in out
    assert out == [SYSTEM, checkpoint, _answer("ok"), *_turn("b", 400)]


def test_tool_call_and_result_never_separated() -> None:
    # SPEC C-3: the group is the unit
    old, mid, new = _tool_turn("old", 3000), _tool_turn("mid", 3000), _tool_turn("new", 10)
    msgs = [SYSTEM, *old, *mid, *new]
    for budget in range(0, estimate_messages_tokens(msgs) + 50, 97):
        out = trim_history(msgs, budget)
        calls = {c.id for m in out for c in m.tool_calls}
        results = {m.tool_call_id for m in out if m.role == "tool"}
        assert calls == results, budget


def test_user_message_between_call_and_result_joins_the_group() -> None:
    call = ToolCall(id="c1", name="ask_user", arguments="{}")
    msgs = [
        SYSTEM,
        _user("first"),
        Message(role="assistant", content="", tool_calls=(call,)),
        _user("an interjection while the call is open"),
        Message(role="tool", content="answer", tool_call_id="c1"),
        _user("second " + "x" * 40),
    ]
    groups = group_turns(msgs[1:])
    assert [len(g) for g in groups] == [4, 1]
    out = trim_history(msgs, estimate_messages_tokens([SYSTEM, msgs[-1]]) + 1)
    assert out == [SYSTEM, msgs[-1]]
    full = trim_history(msgs, 10_000)
    assert full == msgs


def test_messages_before_the_first_user_form_their_own_group() -> None:
    msgs = [SYSTEM, _answer("greeting"), *_turn("a")]
    groups = group_turns(msgs[1:])
    assert groups[0] == [_answer("greeting")]
    assert trim_history(msgs, 10_000) == msgs


def test_only_pinned_messages() -> None:
    assert trim_history([SYSTEM], 0) == [SYSTEM]
    assert trim_history([], 100) == []


def test_order_is_preserved() -> None:
    msgs = [SYSTEM, *_turn("a"), *_tool_turn("b"), *_turn("c")]
    out = trim_history(msgs, 10_000)
    assert out == msgs
