"""Pure translations of the facades: resume values, interrupts, statuses."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.interop.langgraph.stream import modes_of
from shared.agent.approval import ItemDecision
from shared.errors import Conflict, SpecError
from shared.interop.shapes import (
    Answer,
    Approve,
    approval_of,
    decode_resume,
    input_messages,
    interrupt_of,
    lg_run_status,
    lg_thread_status,
    oa_status,
)

ASK = {
    "kind": "ask",
    "ask_id": "call_9",
    "reason": "why",
    "questions": [
        {"question": "Env?", "options": [{"label": "Prod", "value": "prod"}]},
        {"question": "Region?", "options": []},
    ],
}
APPROVAL = {
    "kind": "approval",
    "approval_id": "apr_1",
    "items": [
        {"call_id": "w1", "tool": "write", "arguments": {"item": "A"}, "preview": "write(item=A)"},
        {"call_id": "w2", "tool": "write", "arguments": {"item": "B"}, "preview": "write(item=B)"},
    ],
}


@pytest.mark.parametrize(
    ("value", "answers"),
    [
        ("prod", ["prod"]),
        (["prod", "eu"], ["prod", "eu"]),
        ({"answers": ["prod", "eu"]}, ["prod", "eu"]),
        ({"ask_id": "call_9", "answers": ["prod"]}, ["prod"]),
        ({"call_9": ["prod", "eu"]}, ["prod", "eu"]),
        (
            {
                "decisions": [
                    {"type": "respond", "message": "prod"},
                    {"type": "reject", "message": "eu"},
                ]
            },
            ["prod", "eu"],
        ),
        ([{"type": "response", "args": "prod"}, {"type": "ignore", "args": None}], ["prod", ""]),
    ],
)
def test_ask_resumes(value: Any, answers: list[str]) -> None:
    assert decode_resume(ASK, value) == Answer(answers)


def _d(call_id: str, action: str, **more: Any) -> ItemDecision:
    return ItemDecision.model_validate({"call_id": call_id, "action": action, **more})


@pytest.mark.parametrize(
    ("value", "decided"),
    [
        (True, Approve("all")),
        (False, Approve([], ["w1", "w2"])),
        ({"approve": "all"}, Approve("all")),
        ({"approve": ["w1"], "reject": ["w2"], "note": "no B"}, Approve(["w1"], ["w2"], "no B")),
        (
            {"apr_1": {"decisions": [{"type": "approve"}, {"type": "reject", "message": "no B"}]}},
            approval_of([_d("w1", "approve"), _d("w2", "reject", message="no B")]),
        ),
        (
            {"decisions": [{"type": "respond", "message": "later"}, {"type": "approve"}]},
            approval_of([_d("w1", "reject", message="later"), _d("w2", "approve")]),
        ),
        (
            {
                "decisions": [
                    {"type": "edit", "edited_action": {"name": "write", "args": {"item": "C"}}},
                    {"type": "reject"},
                ]
            },
            approval_of([_d("w1", "edit", arguments={"item": "C"}), _d("w2", "reject")]),
        ),
        (
            [{"type": "accept"}, {"type": "ignore"}],
            approval_of([_d("w1", "approve"), _d("w2", "reject")]),
        ),
        (
            [{"type": "response", "args": "why?"}, {"type": "edit", "args": {"args": {"x": 1}}}],
            approval_of([_d("w1", "reject", message="why?"), _d("w2", "edit", arguments={"x": 1})]),
        ),
    ],
)
def test_approval_resumes(value: Any, decided: Approve) -> None:
    assert decode_resume(APPROVAL, value) == decided


@pytest.mark.parametrize(
    ("pending", "value"),
    [
        (ASK, {"decisions": [{"type": "approve"}, {"type": "respond", "message": "x"}]}),
        (ASK, {"decisions": [{"type": "respond", "message": "x"}]}),  # one per question
        (ASK, True),
        (ASK, {"approve": "all"}),
        (APPROVAL, "yes"),
        (APPROVAL, ["yes"]),
        (APPROVAL, {"answers": ["yes"]}),
        (APPROVAL, {"decisions": [{"type": "approve"}]}),
        (APPROVAL, {"decisions": [{"type": "edit", "edited_action": {}}, {"type": "approve"}]}),
        (APPROVAL, [{"type": "edit", "args": {}}, {"type": "accept"}]),
        (
            APPROVAL,
            {"decisions": [{"type": "edit", "edited_action": {"args": []}}, {"type": "approve"}]},
        ),
        (
            APPROVAL,
            {
                "decisions": [
                    {"type": "edit", "edited_action": {"name": "other", "args": {}}},
                    {"type": "approve"},
                ]
            },
        ),
        (APPROVAL, {"decisions": [{"type": "reject", "message": "x" * 5000}, {"type": "approve"}]}),
    ],
)
def test_resumes_a_pause_does_not_take(pending: dict[str, Any], value: Any) -> None:
    with pytest.raises(SpecError):
        decode_resume(pending, value)


@pytest.mark.parametrize("value", [{"call_other": "x"}, {"ask_id": "call_other", "answers": []}])
def test_resume_naming_another_pause_conflicts(value: Any) -> None:
    with pytest.raises(Conflict):
        decode_resume(ASK, value)


def test_interrupts_in_the_human_in_the_loop_shape() -> None:
    ask = interrupt_of(ASK)
    assert ask["id"] == "call_9"
    assert [r["name"] for r in ask["value"]["action_requests"]] == ["ask_user", "ask_user"]
    assert ask["value"]["treadle"]["kind"] == "ask"
    approval = interrupt_of(APPROVAL)
    assert approval["id"] == "apr_1"
    assert approval["value"]["action_requests"][0] == {
        "name": "write",
        "args": {"item": "A"},
        "description": "write(item=A)",
    }
    assert approval["value"]["review_configs"] == [
        {"action_name": "write", "allowed_decisions": ["approve", "edit", "reject"]}
    ]
    assert approval["value"]["treadle"] == {"kind": "approval", "call_ids": ["w1", "w2"]}


def test_statuses() -> None:
    running, waiting = {"status": "running"}, {"status": "waiting"}
    assert lg_run_status({"status": "queued"}, None) == "pending"
    assert lg_run_status(running, None) == "running"
    assert lg_run_status(waiting, {"type": "run.waiting", "data": {}}) == "success"
    assert lg_run_status(running, {"type": "run.failed", "data": {}}) == "error"
    assert lg_run_status(running, {"type": "run.cancelled", "data": {}}) == "interrupted"
    assert (
        lg_run_status(
            running, {"type": "run.completed", "data": {"stop_reason": "budget_deadline"}}
        )
        == "timeout"
    )
    assert [
        lg_thread_status(r)
        for r in (None, waiting, running, {"status": "failed"}, {"status": "cancelled"})
    ] == ["idle", "interrupted", "busy", "error", "idle"]
    assert oa_status({"status": "queued"}, None) == "queued"
    assert oa_status(waiting, {"type": "run.waiting", "data": {}}) == "completed"
    assert (
        oa_status(running, {"type": "run.completed", "data": {"stop_reason": "max_rounds"}})
        == "incomplete"
    )


def test_inputs_and_modes() -> None:
    got = input_messages(
        [
            {"type": "human", "content": [{"type": "text", "text": "hi"}]},
            {"role": "ai", "content": "yo"},
            {"role": "user", "content": "x"},
        ]
    )
    assert [m["role"] for m in got] == ["user", "assistant", "user"]
    assert got[0]["content"] == [{"type": "text", "text": "hi"}]
    with pytest.raises(SpecError):
        input_messages([{"role": "tool", "content": "x"}])
    assert modes_of(None) == ["values"]
    assert modes_of("", ["updates"]) == ["updates"]
    assert modes_of(["messages-tuple", "values", "debug"]) == ["messages-tuple", "values"]
