"""Approval decisions per item (SPEC N-4), pure: approve, reject with a message, edit."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from shared.agent.approval import (
    APPROVAL_NOTE_KIND,
    MAX_EDIT_BYTES,
    ApprovalError,
    ItemDecision,
    decisions_from_lists,
    declined_text,
    edited_result,
    note_message,
    resolve_approval,
    validate_edit,
)

SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string", "minLength": 1}, "priority": {"enum": [1, 2]}},
    "required": ["title"],
    "additionalProperties": False,
}
SCHEMAS = {"create_ticket": SCHEMA}
ITEMS = [
    {"call_id": "w1", "tool": "create_ticket", "arguments": {"title": "Disk full"}},
    {"call_id": "w2", "tool": "create_ticket", "arguments": {"title": "Fan noise"}},
]


def _d(call_id: str, action: str, **kw: Any) -> ItemDecision:
    return ItemDecision(call_id=call_id, action=action, **kw)  # type: ignore[arg-type]


def test_approve_reject_with_message_and_edit() -> None:
    out = resolve_approval(
        ITEMS,
        [
            _d("w2", "reject", message="  not this   one "),
            _d("w1", "edit", arguments={"title": "Disk 95% full", "priority": 1}),
        ],
        SCHEMAS,
    )
    assert [r.call_id for r in out] == ["w1", "w2"]  # the items' order, not the decisions'
    edit, reject = out
    assert (edit.action, edit.run, json.loads(edit.arguments)) == (
        "edit",
        True,
        {"title": "Disk 95% full", "priority": 1},
    )
    assert edit.proposed == {"title": "Disk full"}
    assert (reject.run, reject.result) == (False, "Declined by user: not this one")


def test_approve_runs_the_proposed_arguments() -> None:
    (one, two) = resolve_approval(ITEMS, [_d("w1", "approve")], SCHEMAS)
    assert (one.action, json.loads(one.arguments), one.result) == (
        "approve",
        {"title": "Disk full"},
        None,
    )
    assert (two.action, two.result) == ("reject", "Declined by user")  # not decided: rejected


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ({}, "missing"),
        ({"title": ""}, "title"),
        ({"title": "x", "priority": 3}, "priority"),
        ({"title": "x", "extra": 1}, "extra"),
    ],
)
def test_an_edit_must_pass_the_tools_schema(arguments: dict[str, Any], problem: str) -> None:
    with pytest.raises(ApprovalError, match=f"Invalid arguments for create_ticket: .*{problem}"):
        resolve_approval(ITEMS, [_d("w1", "edit", arguments=arguments)], SCHEMAS)


def test_validate_edit_bounds_the_size_and_wants_an_object() -> None:
    assert validate_edit("t", ["a"], {"type": "object"}) == (
        "Invalid arguments for t: expected an object"
    )
    huge = {"title": "x" * (MAX_EDIT_BYTES + 1)}
    assert "at most" in (validate_edit("t", huge, {"type": "object"}) or "")
    assert validate_edit("t", {"title": "ok"}, SCHEMA) is None


@pytest.mark.parametrize(
    ("decisions", "error"),
    [
        ([_d("w9", "approve")], "unknown call ids in the approval: w9"),
        ([_d("w1", "approve"), _d("w1", "reject")], "two decisions for call w1"),
    ],
)
def test_decisions_that_do_not_fit_the_items(decisions: list[ItemDecision], error: str) -> None:
    with pytest.raises(ApprovalError, match=error):
        resolve_approval(ITEMS, decisions, SCHEMAS)


@pytest.mark.parametrize(
    "body",
    [
        {"call_id": "w1", "action": "edit"},  # edit without arguments
        {"call_id": "w1", "action": "approve", "arguments": {}},
        {"call_id": "w1", "action": "approve", "message": "why"},
        {"call_id": "w1", "action": "maybe"},
        {"call_id": "", "action": "approve"},
        {"call_id": "w1", "action": "reject", "message": "x" * 5000},
        {"call_id": "w1", "action": "approve", "by": "me"},
    ],
)
def test_a_malformed_decision_is_refused(body: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ItemDecision.model_validate(body)


def test_the_list_form_becomes_decisions() -> None:
    ids = ["w1", "w2", "w3"]
    assert [(d.call_id, d.action) for d in decisions_from_lists(ids, "all")] == [
        ("w1", "approve"),
        ("w2", "approve"),
        ("w3", "approve"),
    ]
    got = decisions_from_lists(ids, ["w2"], ["w1"])
    assert [d.action for d in got] == ["reject", "approve", "reject"]
    with pytest.raises(ApprovalError, match="both approved and rejected: w1"):
        decisions_from_lists(ids, ["w1"], ["w1"])
    with pytest.raises(ApprovalError, match="unknown call ids"):
        decisions_from_lists(ids, ["w4"])


def test_declined_text() -> None:
    assert declined_text() == declined_text("  ") == "Declined by user"
    assert declined_text("use the\nstaging queue") == "Declined by user: use the staging queue"


def test_the_record_says_who_what_and_what_was_proposed() -> None:
    (edit, reject) = resolve_approval(
        ITEMS,
        [_d("w1", "edit", arguments={"title": "New"}), _d("w2", "reject", message="no")],
        SCHEMAS,
    )
    assert edit.record("key_1", 10.0) == {
        "call_id": "w1",
        "action": "edit",
        "by": "key_1",
        "at": 10.0,
        "proposed_arguments": {"title": "Disk full"},
        "arguments": {"title": "New"},
    }
    assert reject.record(None, 11.0)["message"] == "no"


def test_an_edited_result_tells_the_model_what_ran() -> None:
    text = edited_result('{"title": "New"}', "created #7")
    assert text.endswith("created #7") and '{"title": "New"}' in text


def test_the_note_reaches_the_summary_round_as_a_user_turn() -> None:
    assert note_message(None) is None and note_message("  ") is None
    msg = note_message("Also  tag it\nurgent")
    assert msg is not None
    assert (msg.role, msg.text, msg.kind) == (
        "user",
        "Note from the approver: Also tag it urgent",
        APPROVAL_NOTE_KIND,
    )
