"""Tool-result reduction (SPEC L-7) and context checkpoints (SPEC L-8)."""

from __future__ import annotations

import json
import re

import pytest

from shared.agent.compression import (
    CHECKPOINT_KIND,
    CHECKPOINT_SYSTEM_PROMPT,
    checkpoint_message,
    checkpoint_request_messages,
    clean_checkpoint_summary,
    elide_ids,
    model_view,
    needs_checkpoint,
    reduce_tool_result,
    tool_result_budget,
    truncate_middle,
)
from shared.agent.messages import Message, ToolCall
from shared.agent.plan import Plan, PlanStep
from shared.agent.tokens import estimate_messages_tokens, estimate_tokens

MARKER = re.compile(r"\n\[\.\.\. truncated (\d+) tokens \.\.\.\]\n")

# --- SPEC L-7: budget -------------------------------------------------------------------


def test_budget_default_is_20_percent_at_least_4096() -> None:
    assert tool_result_budget(128_000, None) == 25_600
    assert tool_result_budget(16_000, None) == 4096
    assert tool_result_budget(1_000_000) == 200_000


def test_budget_override_wins() -> None:
    assert tool_result_budget(128_000, 1000) == 1000


def test_budget_never_exceeds_a_tiny_window() -> None:
    assert tool_result_budget(2048, None) == 2048


# --- SPEC L-7: reduction ----------------------------------------------------------------


def test_small_results_are_unchanged() -> None:
    text = '{\n  "a": 1,\n  "b": "x"\n}'
    assert reduce_tool_result(text, 1000) is text
    plain = "hello   world\n\n\n\nbye"
    assert reduce_tool_result(plain, 1000) is plain


def test_json_is_minified_when_that_fits() -> None:
    value = {"rows": [{"id": i, "name": f"name {i}", "ok": True} for i in range(40)]}
    pretty = json.dumps(value, indent=4)
    budget = estimate_tokens(json.dumps(value, separators=(",", ":"))) + 5
    assert estimate_tokens(pretty) > budget
    out = reduce_tool_result(pretty, budget)
    assert out == json.dumps(value, separators=(",", ":"))
    assert json.loads(out) == value


def test_json_base64_is_elided_before_anything_is_cut() -> None:
    blob = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk" * 20
    value = {"file": "a.png", "content": blob, "size": 123}
    out = reduce_tool_result(json.dumps(value, indent=2), 100)
    parsed = json.loads(out)
    assert parsed["file"] == "a.png" and parsed["size"] == 123
    assert parsed["content"] == f"[base64, {len(blob)} chars]"


def test_big_json_is_summarized_structurally() -> None:
    value = {"total": 5000, "items": [{"id": i, "title": f"title {i}"} for i in range(5000)]}
    out = reduce_tool_result(json.dumps(value), 600)
    assert estimate_tokens(out) <= 600
    parsed = json.loads(out)  # still valid JSON with the same shape
    assert parsed["total"] == 5000
    items = parsed["items"]
    assert items[0] == {"id": 0, "title": "title 0"}
    assert items[-1] == {"id": 4999, "title": "title 4999"}
    assert any(isinstance(x, str) and "more items" in x for x in items)


def test_long_text_gets_marker_and_fits() -> None:
    text = " ".join(f"word{i}" for i in range(20_000))
    out = reduce_tool_result(text, 1000)
    assert estimate_tokens(out) <= 1000
    match = MARKER.search(out)
    assert match is not None
    head, tail = out[: match.start()], out[match.end() :]
    assert text.startswith(head)
    assert text.endswith(tail)
    omitted = int(match.group(1))
    assert omitted == estimate_tokens(text) - estimate_tokens(head) - estimate_tokens(tail)


def test_head_tail_split_is_60_40() -> None:
    text = "abcdefgh " * 10_000  # no line breaks: nothing snaps
    out = truncate_middle(text, 2000)
    match = MARKER.search(out)
    assert match is not None
    head_tokens = estimate_tokens(out[: match.start()])
    tail_tokens = estimate_tokens(out[match.end() :])
    share = head_tokens / (head_tokens + tail_tokens)
    assert 0.58 <= share <= 0.62
    assert head_tokens + tail_tokens >= 1900  # the budget is used


@pytest.mark.parametrize("budget", [64, 100, 257, 1000, 4096])
def test_cjk_text_fits_every_budget(budget: int) -> None:
    text = "模组冲突导致游戏崩溃，请检查日志。mixed English words too. " * 2000
    out = reduce_tool_result(text, budget)
    assert estimate_tokens(out) <= budget
    assert MARKER.search(out)


def test_text_cleanup_alone_can_be_enough() -> None:
    noisy = "result:" + " " * 5000 + "done\n\n\n\n\n\nend"
    out = reduce_tool_result(noisy, 50)
    assert out == "result: done\n\nend"


def test_lines_are_kept_whole_when_possible() -> None:
    text = "\n".join(f"row {i:05d}: " + "x" * 60 for i in range(3000))
    out = reduce_tool_result(text, 800)
    match = MARKER.search(out)
    assert match is not None
    assert all(line.startswith("row ") for line in out[match.end() :].splitlines())


def test_elide_ids() -> None:
    sha = "0123456789abcdef0123456789abcdef01234567"
    uuid = "123e4567-e89b-12d3-a456-426614174000"
    data_url = "data:image/png;base64," + "QUJD" * 50
    out = elide_ids(f"commit {sha} id {uuid} img {data_url} end")
    assert sha not in out and "0123456789ab…" in out
    assert uuid in out  # UUIDs are short enough to keep (tools take them as arguments)
    assert "[base64 data, " in out and "QUJDQUJD" not in out
    assert out.endswith(" end")


# --- SPEC L-8: model view ---------------------------------------------------------------

SYSTEM = Message(role="system", content="You are helpful.")


def _checkpoint(text: str = "Goal: x") -> Message:
    return checkpoint_message(text, None)


def test_model_view_without_checkpoint_is_everything() -> None:
    msgs = [SYSTEM, Message(role="user", content="hi"), Message(role="assistant", content="yo")]
    assert model_view(msgs) == msgs


def test_model_view_starts_at_the_last_checkpoint() -> None:
    first, second = _checkpoint("one"), _checkpoint("two")
    after = Message(role="assistant", content="after")
    msgs = [
        SYSTEM,
        Message(role="user", content="old"),
        first,
        Message(role="user", content="mid"),
        second,
        after,
    ]
    assert model_view(msgs) == [SYSTEM, second, after]


# --- SPEC L-8: when to compress ---------------------------------------------------------


def _filler(tokens: int) -> Message:
    return Message(role="user", content="abcd" * tokens)


def test_needs_checkpoint_over_80_percent() -> None:
    window = 10_000
    small = [SYSTEM, _filler(7000)]
    big = [SYSTEM, _filler(8100)]
    assert estimate_messages_tokens(small) < 8000 < estimate_messages_tokens(big)
    assert not needs_checkpoint(small, window, 1000)
    assert needs_checkpoint(big, window, 1000)


def test_needs_checkpoint_when_max_tokens_leaves_less_room() -> None:
    assert needs_checkpoint([SYSTEM, _filler(6000)], 10_000, 5000)


def test_history_does_not_count_as_the_runs_own() -> None:
    history = Message(role="user", content="abcd" * 9000, kind="history")
    assert not needs_checkpoint([SYSTEM, history, _filler(10)], 10_000, 1000)


def test_nothing_to_compress_after_a_checkpoint() -> None:
    huge_checkpoint = _checkpoint("x " * 40_000)
    assert not needs_checkpoint([SYSTEM, huge_checkpoint], 10_000, 1000)


def test_extra_tokens_count() -> None:
    msgs = [SYSTEM, _filler(7000)]
    assert not needs_checkpoint(msgs, 10_000, 1000)
    assert needs_checkpoint(msgs, 10_000, 1000, extra_tokens=2000)


# --- SPEC L-8: the summarization request and the checkpoint -----------------------------

PLAN = Plan(name="Fix </active_plan> bug", steps=(PlanStep("s1", "read logs", "done", "ok"),))


def _transcript() -> list[Message]:
    call = ToolCall(id="c1", name="search", arguments='{"q": "logs"}')
    return [
        SYSTEM,
        Message(role="user", content="old question"),
        _checkpoint("Earlier: user wants logs fixed"),
        Message(role="user", content="Please fix the crash"),
        Message(role="assistant", content="Looking.", tool_calls=(call,)),
        Message(role="tool", content="found 3 errors", tool_call_id="c1", name="search"),
    ]


def test_checkpoint_request_messages() -> None:
    req = checkpoint_request_messages(_transcript(), PLAN)
    assert [m.role for m in req] == ["system", "user"]
    assert req[0].content == CHECKPOINT_SYSTEM_PROMPT
    body = req[1].text
    assert "You are helpful." not in body  # everything after the system prompt
    assert "old question" not in body  # the model view only
    assert "Earlier: user wants logs fixed" in body
    assert "Please fix the crash" in body
    assert 'search({"q": "logs"})' in body
    assert "found 3 errors" in body
    assert body.index("<active_plan>") < body.index("<transcript>")
    assert all(not m.tool_calls for m in req)


def test_checkpoint_request_respects_a_budget() -> None:
    msgs = [*_transcript(), Message(role="tool", content="y " * 50_000, tool_call_id="c1")]
    req = checkpoint_request_messages(msgs, None, budget_tokens=2000)
    assert estimate_tokens(req[1].text) <= 2100
    assert "<active_plan>" not in req[1].text


def test_checkpoint_message_shape() -> None:
    msg = checkpoint_message("Goal: fix it\nNext: restart", PLAN)
    assert msg.role == "user"
    assert msg.kind == CHECKPOINT_KIND == "context_checkpoint"
    assert msg.hidden
    text = msg.text
    assert text.startswith("<active_plan>\n")
    assert text.endswith("<context_checkpoint>\nGoal: fix it\nNext: restart\n</context_checkpoint>")
    plan_text = text[len("<active_plan>\n") : text.index("\n</active_plan>")]
    assert "</" not in plan_text  # the plan cannot close its own tag
    assert json.loads(plan_text) == PLAN.to_dict()


def test_checkpoint_without_plan() -> None:
    msg = checkpoint_message("Goal: x", None)
    assert msg.text == "<context_checkpoint>\nGoal: x\n</context_checkpoint>"


@pytest.mark.parametrize(
    "reply",
    [
        "<context_checkpoint>\nGoal: x\n</context_checkpoint>",
        "```xml\n<context_checkpoint>\nGoal: x\n</context_checkpoint>\n```",
        "Here it is:\n<context_checkpoint>Goal: x",
        "```\nGoal: x\n```",
        "  Goal: x  ",
    ],
)
def test_summary_is_cleaned(reply: str) -> None:
    assert clean_checkpoint_summary(reply) == "Goal: x"
    assert checkpoint_message(reply, None).text == (
        "<context_checkpoint>\nGoal: x\n</context_checkpoint>"
    )


@pytest.mark.parametrize(
    "reply", ["", "   ", "```\n```", "<context_checkpoint></context_checkpoint>"]
)
def test_empty_summary_is_a_failed_compression(reply: str) -> None:
    assert clean_checkpoint_summary(reply) is None
    with pytest.raises(ValueError):
        checkpoint_message(reply, None)
