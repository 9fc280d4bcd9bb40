"""Decisions on a pending approval, per item (SPEC N-4), before any I/O.

A person decides each proposed write: ``approve`` it, ``reject`` it (with an optional message
the model reads as the tool result ``Declined by user: <message>``), or ``edit`` it (approve
with other arguments, which must pass the tool's JSON schema). ``resolve_approval`` checks the
decisions against the pending items and says, per item, what runs and what the model reads;
``note_message`` is how the approver's note reaches the model in the summary round.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from shared.agent.arguments import validate_against_schema
from shared.agent.messages import Message

__all__ = [
    "APPROVAL_NOTE_KIND",
    "DECLINED_TEXT",
    "MAX_EDIT_BYTES",
    "MAX_MESSAGE_CHARS",
    "ApprovalAction",
    "ApprovalError",
    "ItemDecision",
    "Resolved",
    "decisions_from_lists",
    "declined_text",
    "edited_result",
    "note_message",
    "resolve_approval",
    "same_decisions",
    "validate_edit",
]

DECLINED_TEXT = "Declined by user"
APPROVAL_NOTE_KIND = "approval_note"
MAX_MESSAGE_CHARS = 4000  # a reject message or a note
MAX_EDIT_BYTES = 64_000  # edited arguments, as JSON

ApprovalAction = Literal["approve", "reject", "edit"]
_CallId = Annotated[str, Field(min_length=1, max_length=128)]


class ApprovalError(ValueError):
    """The decisions do not fit the pending approval (the API answers 4xx, nothing written)."""


class ItemDecision(BaseModel):
    """One person's decision on one proposed write (the API body's ``decisions[]``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    call_id: _CallId
    action: ApprovalAction
    message: str | None = Field(default=None, max_length=MAX_MESSAGE_CHARS)  # reject only
    arguments: dict[str, Any] | None = None  # edit only: the arguments that run

    @model_validator(mode="after")
    def _fields_fit_the_action(self) -> ItemDecision:
        if self.action == "edit" and self.arguments is None:
            raise ValueError("an `edit` decision needs `arguments`")
        if self.action != "edit" and self.arguments is not None:
            raise ValueError(f"`arguments` belong to an `edit` decision, not `{self.action}`")
        if self.action != "reject" and self.message is not None:
            raise ValueError(f"`message` belongs to a `reject` decision, not `{self.action}`")
        return self


@dataclass(frozen=True, slots=True)
class Resolved:
    """What one item becomes. ``run``: the call runs, with ``arguments`` (JSON text; the
    edited ones for an edit). Not ``run``: ``result`` is its tool message (declined)."""

    call_id: str
    tool: str
    action: ApprovalAction
    arguments: str
    proposed: dict[str, Any]
    result: str | None = None
    message: str | None = None

    @property
    def run(self) -> bool:
        return self.action != "reject"

    def record(self, by: str | None, at: float) -> dict[str, Any]:
        """The decision as stored on the call (``tool_calls.data``) and in ``run.resumed``."""
        out: dict[str, Any] = {"call_id": self.call_id, "action": self.action, "by": by, "at": at}
        if self.message is not None:
            out["message"] = self.message
        if self.action == "edit":
            out["proposed_arguments"] = self.proposed
            out["arguments"] = json.loads(self.arguments)
        return out


def declined_text(message: str | None = None) -> str:
    """The tool result of a rejected write: ``Declined by user`` or ``…: <message>``."""
    text = " ".join((message or "").split())
    return f"{DECLINED_TEXT}: {text}" if text else DECLINED_TEXT


def validate_edit(tool: str, arguments: Any, schema: Mapping[str, Any]) -> str | None:
    """Why edited ``arguments`` cannot run ``tool`` (the message for a 422), else None."""
    if not isinstance(arguments, dict):
        return f"Invalid arguments for {tool}: expected an object"
    size = len(json.dumps(arguments, ensure_ascii=False).encode())
    if size > MAX_EDIT_BYTES:
        return f"Invalid arguments for {tool}: {size} bytes, at most {MAX_EDIT_BYTES}"
    problem = validate_against_schema(arguments, schema)
    return f"Invalid arguments for {tool}: {problem}" if problem else None


def edited_result(arguments: str, result: str) -> str:
    """What the model reads for an edited call: the arguments that ran, then the result.
    The assistant message keeps what the model proposed, so both are in the transcript."""
    return f"The user edited the arguments before approving; ran with {arguments}\n\n{result}"


def decisions_from_lists(
    ids: Sequence[str], approve: Sequence[str] | str, reject: Sequence[str] | None = None
) -> list[ItemDecision]:
    """The list form (``approve: [ids] | "all"``, ``reject: [ids]``) as decisions: every item
    not approved is rejected."""
    chosen = list(ids) if approve == "all" else list(approve)
    refused = list(reject or ())
    _check_known(ids, [*chosen, *refused])
    both = sorted(set(chosen) & set(refused))
    if both:
        raise ApprovalError(f"call ids both approved and rejected: {', '.join(both)}")
    return [ItemDecision(call_id=i, action="approve" if i in chosen else "reject") for i in ids]


def resolve_approval(
    items: Sequence[Mapping[str, Any]],
    decisions: Sequence[ItemDecision],
    schemas: Mapping[str, Mapping[str, Any]],
) -> tuple[Resolved, ...]:
    """Each pending item with its decision, in the items' order. An item without a decision is
    rejected (as the list form does); a decision for no item, two for one item, or an edit
    that fails the tool's schema raise ``ApprovalError``. ``schemas``: tool name -> JSON
    schema of its parameters (the run's catalog)."""
    ids = [str(item["call_id"]) for item in items]
    _check_known(ids, [d.call_id for d in decisions])
    by_id: dict[str, ItemDecision] = {}
    for d in decisions:
        if d.call_id in by_id:
            raise ApprovalError(f"two decisions for call {d.call_id}")
        by_id[d.call_id] = d
    return tuple(_resolve(item, by_id.get(str(item["call_id"])), schemas) for item in items)


def _check_known(ids: Sequence[str], named: Sequence[str]) -> None:
    unknown = sorted(set(named) - set(ids))
    if unknown:
        raise ApprovalError(f"unknown call ids in the approval: {', '.join(unknown)}")


def _resolve(
    item: Mapping[str, Any],
    decision: ItemDecision | None,
    schemas: Mapping[str, Mapping[str, Any]],
) -> Resolved:
    call_id, tool = str(item["call_id"]), str(item["tool"])
    proposed = dict(item.get("arguments") or {})
    original = json.dumps(proposed, ensure_ascii=False)
    if decision is None or decision.action == "reject":
        message = decision.message if decision is not None else None
        return Resolved(
            call_id, tool, "reject", original, proposed, declined_text(message), message
        )
    if decision.action == "approve":
        return Resolved(call_id, tool, "approve", original, proposed)
    problem = validate_edit(tool, decision.arguments, schemas.get(tool, {"type": "object"}))
    if problem:
        raise ApprovalError(problem)
    edited = json.dumps(decision.arguments, ensure_ascii=False)
    return Resolved(call_id, tool, "edit", edited, proposed)


def same_decisions(
    recorded: Mapping[str, Mapping[str, Any]], decisions: Sequence[ItemDecision]
) -> bool:
    """Whether ``decisions`` are the ones already taken on an approval (N-4): ``recorded``
    maps each of its call ids to the decision stored on the call (``Resolved.record``). The
    same decision again is idempotent; a different one comes too late (409). An item without
    a decision is rejected, as ``resolve_approval`` has it."""
    given = {d.call_id: d for d in decisions}
    if set(given) - set(recorded):
        return False
    for call_id, record in recorded.items():
        d = given.get(call_id) or ItemDecision(call_id=call_id, action="reject")
        if d.action != record.get("action"):
            return False
        if d.action == "reject" and (d.message or None) != (record.get("message") or None):
            return False
        if d.action == "edit" and d.arguments != record.get("arguments"):
            return False
    return True


def note_message(note: str | None) -> Message | None:
    """The approver's note as the model reads it in the summary round: a user turn appended
    after the batch's tool messages (never between a call and its result), or None."""
    text = " ".join((note or "").split())[:MAX_MESSAGE_CHARS]
    if not text:
        return None
    return Message(role="user", content=f"Note from the approver: {text}", kind=APPROVAL_NOTE_KIND)
