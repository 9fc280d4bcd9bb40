"""A thread's earlier turns as a new run's history (SPEC C-3, L-8)."""

from __future__ import annotations

from shared.agent.compression import checkpoint_message, needs_checkpoint
from shared.agent.messages import Message, ToolCall
from shared.agent.thread import HISTORY_KIND, thread_history
from shared.llm.scripted import round_index


def _user(text: str) -> Message:
    return Message(role="user", content=text)


def _answer(text: str) -> Message:
    return Message(role="assistant", content=text)


def test_runs_in_order_and_marked_as_history() -> None:
    history = thread_history([[_user("q1"), _answer("a1")], [_user("q2"), _answer("a2")]])
    assert [(m.role, m.text) for m in history] == [
        ("user", "q1"),
        ("assistant", "a1"),
        ("user", "q2"),
        ("assistant", "a2"),
    ]
    assert {m.kind for m in history} == {HISTORY_KIND}


def test_system_prompts_checkpoints_and_copied_history_are_left_out() -> None:
    run = [
        Message(role="system", content="You are X."),
        Message(role="user", content="old", kind=HISTORY_KIND),
        _user("q"),
        checkpoint_message("summary", None),
        _answer("a"),
    ]
    assert [(m.role, m.text) for m in thread_history([run])] == [("user", "q"), ("assistant", "a")]


def test_dangling_tool_calls_are_dropped_pairs_kept() -> None:
    done = ToolCall(id="c1", name="t")
    dangling = ToolCall(id="c2", name="t")
    run = [
        _user("q"),
        Message(role="assistant", content="", tool_calls=(done, dangling)),
        Message(role="tool", content="r1", tool_call_id="c1", name="t"),
        Message(role="tool", content="orphan", tool_call_id="zz", name="t"),
    ]
    history = thread_history([run])
    assert history[1].tool_calls == (done,)
    assert [m.text for m in history if m.role == "tool"] == ["r1"]


def test_tool_call_ids_pair_within_a_run() -> None:
    # the same id in two runs: a result in run 2 does not answer run 1's call
    first = [_user("q1"), Message(role="assistant", content="", tool_calls=(ToolCall("c1", "t"),))]
    second = [
        _user("q2"),
        Message(role="assistant", content="", tool_calls=(ToolCall("c1", "t"),)),
        Message(role="tool", content="r", tool_call_id="c1", name="t"),
    ]
    history = thread_history([first, second])
    assert history[1].tool_calls == () and history[3].tool_calls == (ToolCall("c1", "t"),)


def test_history_is_not_the_runs_own_context() -> None:
    # SPEC L-8: compression counts only the run's own messages; scripted rounds ignore history
    history = thread_history([[_user("q" * 4000), _answer("a" * 4000)]])
    own = [_user("now")]
    assert not needs_checkpoint([*history, *own], context_window=2000, max_tokens=100)
    assert round_index([*history, *own]) == 0
