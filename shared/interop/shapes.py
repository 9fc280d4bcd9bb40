"""Pure translations between treadle and the two protocols: statuses, messages,
pauses as LangChain human-in-the-loop interrupts, and resume values back to answers and
approvals. No I/O here."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from shared.agent.approval import ItemDecision
from shared.errors import Conflict, SpecError
from shared.vocab import EventType

__all__ = [
    "Answer",
    "Approve",
    "approval_of",
    "decision",
    "decode_resume",
    "input_messages",
    "interrupt_of",
    "lc_messages",
    "lg_run_status",
    "lg_thread_status",
    "oa_status",
    "pause_id",
    "tool_args",
    "Row",
]

ASK_DECISIONS = ["respond", "reject"]
APPROVAL_DECISIONS = ["approve", "edit", "reject"]
_ROLES = {
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "ai": "assistant",
    "system": "system",
}
_BODY_KEYS = frozenset(
    {"answers", "decisions", "approve", "reject", "note", "ask_id", "approval_id"}
)
Row = Mapping[Any, Any]  # a RowMapping or a dict
INCOMPLETE = frozenset({"max_rounds", "budget_cost", "budget_deadline", "budget_tool_calls"})


# --- statuses -----------------------------------------------------------------------------


def lg_run_status(run: Row, end: Row | None) -> str:
    """A LangGraph run's status: a pause ends it ``success`` (docs/api.md)."""
    if end is None:
        return "pending" if run["status"] == "queued" else "running"
    kind = end["type"]
    if kind == EventType.RUN_FAILED:
        return "error"
    if kind == EventType.RUN_CANCELLED:
        return "interrupted"
    if (
        kind == EventType.RUN_COMPLETED
        and (end["data"] or {}).get("stop_reason") == "budget_deadline"
    ):
        return "timeout"
    return "success"


def lg_thread_status(latest: Row | None) -> str:
    """A thread's status from its newest run: waiting → interrupted, active → busy."""
    if latest is None:
        return "idle"
    status = latest["status"]
    if status == "waiting" and (latest.get("pending") or {}).get("kind") == "provider":
        return "busy"  # waiting out a provider outage: it goes on by itself
    if status == "waiting":
        return "interrupted"
    if status in ("queued", "running"):
        return "busy"
    return "error" if status == "failed" else "idle"


def oa_status(run: Row, end: Row | None) -> str:
    """An OpenAI response's status (a pause completes it, with the pause's items)."""
    if end is None:
        return "queued" if run["status"] == "queued" else "in_progress"
    kind = end["type"]
    if kind == EventType.RUN_FAILED:
        return "failed"
    if kind == EventType.RUN_CANCELLED:
        return "cancelled"
    if kind == EventType.RUN_COMPLETED and (end["data"] or {}).get("stop_reason") in INCOMPLETE:
        return "incomplete"
    return "completed"


# --- messages -----------------------------------------------------------------------------


def tool_args(arguments: str | None) -> dict[str, Any]:
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {"value": value}


def _text(content: Any) -> Any:
    return content if content is not None else ""


def _lc_ai(row: Row, msg_id: str) -> dict[str, Any]:
    calls = [
        {
            "id": c["id"],
            "name": c["name"],
            "args": tool_args(c.get("arguments")),
            "type": "tool_call",
        }
        for c in row["tool_calls"] or []
    ]
    extra = {"reasoning_content": row["reasoning"]} if row["reasoning"] else {}
    return {
        "type": "ai",
        "content": _text(row["content"]),
        "id": msg_id,
        "name": None,
        "tool_calls": calls,
        "invalid_tool_calls": [],
        "additional_kwargs": extra,
        "response_metadata": {},
        "usage_metadata": None,
    }


def lc_messages(
    rows: Iterable[Row], run_id: str | None = None, upto: float | None = None
) -> list[dict[str, Any]]:
    """Stored messages as LangChain message dicts. ``upto``: only ``run_id``'s messages
    created by then (the thread as of one of its events). An assistant message's id is
    ``{run}:r{round}`` (known at its first streamed delta)."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for row in rows:
        if upto is not None and row["run_id"] == run_id and row["created_at"] > upto:
            continue
        msg = lc_message(row, seen)
        if msg is not None:
            out.append(msg)
    return out


def ai_id(run_id: str, round_: int) -> str:
    return f"{run_id}:r{round_}"


def lc_message(row: Row, seen: set[str] | None = None) -> dict[str, Any] | None:
    if row["hidden"] or row["kind"] or row["role"] == "system":
        return None
    plain = f"{row['run_id']}:{row['seq']}"
    if row["role"] == "assistant":
        msg_id = ai_id(row["run_id"], row["round"])
        if seen is not None:
            msg_id = plain if msg_id in seen else msg_id
            seen.add(msg_id)
        return _lc_ai(row, msg_id)
    if row["role"] == "tool":
        return {
            "type": "tool",
            "content": _text(row["content"]),
            "id": plain,
            "tool_call_id": row["tool_call_id"],
            "name": row["name"],
            "status": "success",
            "additional_kwargs": {},
            "response_metadata": {},
        }
    return {
        "type": "human",
        "content": _text(row["content"]),
        "id": plain,
        "name": None,
        "additional_kwargs": {},
        "response_metadata": {},
    }


def _content(value: Any, where: str) -> str | list[dict[str, Any]]:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) for p in value):
        return [_part(p) for p in value]
    raise SpecError(f"{where}: content must be a string or a list of content parts")


def _part(part: dict[str, Any]) -> dict[str, Any]:
    kind = part.get("type")
    if kind in ("text", "input_text", "output_text"):
        return {"type": "text", "text": str(part.get("text", ""))}
    if kind in ("image_url", "input_image"):
        url = part.get("image_url")
        url = url.get("url") if isinstance(url, dict) else url
        return {"type": "image_url", "image_url": {"url": str(url or "")}}
    raise SpecError(f"unsupported content part type {kind!r}")


def input_messages(items: Sequence[Any], where: str = "input.messages") -> list[dict[str, Any]]:
    """Client messages (``role`` user|human|assistant|ai|system, or LangChain ``type``) as
    treadle input messages; the last must be the user's."""
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            out.append({"role": "user", "content": item})
            continue
        if not isinstance(item, dict):
            raise SpecError(f"{where}[{i}]: expected a message object")
        role = _ROLES.get(str(item.get("role") or item.get("type") or ""))
        if role is None:
            raise SpecError(f"{where}[{i}]: role must be user, assistant or system")
        out.append({"role": role, "content": _content(item.get("content", ""), f"{where}[{i}]")})
    if not out:
        raise SpecError(f"{where}: at least one message is needed")
    return out


# --- pauses as interrupts (LangChain's human-in-the-loop shape) ---------------------------


def pause_id(pending: Row) -> str:
    key = "ask_id" if pending.get("kind") == "ask" else "approval_id"
    return str(pending.get(key))


def interrupt_of(pending: Row) -> dict[str, Any]:
    """A pause as a LangGraph interrupt in the HumanInTheLoopMiddleware shape, plus ``treadle``."""
    if pending.get("kind") == "ask":
        return {"id": pause_id(pending), "value": _ask_value(pending)}
    return {"id": pause_id(pending), "value": _approval_value(pending)}


def _ask_value(pending: Row) -> dict[str, Any]:
    questions = list(pending.get("questions") or [])
    requests = [
        {
            "name": "ask_user",
            "description": q.get("question", ""),
            "args": {"question": q.get("question", ""), "options": q.get("options", [])},
        }
        for q in questions
    ]
    return {
        "action_requests": requests,
        "review_configs": [{"action_name": "ask_user", "allowed_decisions": ASK_DECISIONS}],
        "treadle": {"kind": "ask", "reason": pending.get("reason", ""), "questions": questions},
    }


def _approval_value(pending: Row) -> dict[str, Any]:
    items = list(pending.get("items") or [])
    requests = [
        {
            "name": it["tool"],
            "args": it.get("arguments") or {},
            "description": it.get("preview", ""),
        }
        for it in items
    ]
    tools = list(dict.fromkeys(it["tool"] for it in items))
    return {
        "action_requests": requests,
        "review_configs": [
            {"action_name": t, "allowed_decisions": APPROVAL_DECISIONS} for t in tools
        ],
        "treadle": {"kind": "approval", "call_ids": [it["call_id"] for it in items]},
    }


# --- resume values (docs/api.md, Interrupts and resume values) ----------------------------


@dataclass(frozen=True)
class Answer:
    answers: list[str]


@dataclass(frozen=True)
class Approve:
    """The list form (``approve``, ``reject``), or per-item ``decisions`` (then ``approve``
    and ``reject`` only name who is approved and who is not)."""

    approve: list[str] | str
    reject: list[str] = field(default_factory=list)
    note: str | None = None
    decisions: list[ItemDecision] | None = None


def decode_resume(pending: Row, value: Any) -> Answer | Approve:
    """What a resume value does to the pending pause. Conflict (409) for another pause's id,
    SpecError (422) for a shape the pause does not take."""
    value = _unwrap(pending, value)
    if pending.get("kind") == "ask":
        return _ask_resume(pending, value)
    return _approval_resume(pending, value)


def _unwrap(pending: Row, value: Any) -> Any:
    """``{"<interrupt id>": v}`` → v; a native body naming another pause → 409."""
    pid = pause_id(pending)
    if isinstance(value, dict) and len(value) == 1 and not set(value) & _BODY_KEYS:
        key = next(iter(value))
        if key != pid:
            raise Conflict(f"no pending interrupt {key!r}; the thread waits on {pid!r}")
        return value[key]
    named = value.get("ask_id") or value.get("approval_id") if isinstance(value, dict) else None
    if named and named != pid:
        raise Conflict(f"no pending interrupt {named!r}; the thread waits on {pid!r}")
    return value


def _strings(values: list[Any], where: str) -> list[str]:
    if not all(isinstance(v, str) for v in values):
        raise SpecError(f"{where}: expected strings")
    return [str(v) for v in values]


def _ask_resume(pending: Row, value: Any) -> Answer:
    n = len(pending.get("questions") or [])
    if isinstance(value, str):
        return Answer([value])
    if isinstance(value, dict) and "answers" in value and isinstance(value["answers"], list):
        return Answer(_strings(value["answers"], "answers"))
    if isinstance(value, dict) and isinstance(value.get("decisions"), list):
        return Answer([_ask_decision(d) for d in _counted(value["decisions"], n, "decisions")])
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return Answer([_legacy_answer(d) for d in _counted(value, n, "responses")])
    if isinstance(value, list) and not isinstance(value, bool):
        return Answer(_strings(value, "answers"))
    raise SpecError(
        "this interrupt is a question: resume with answers (a string, a list of "
        "strings, {'answers': [...]} or respond decisions)"
    )


def _counted(items: list[Any], n: int, what: str) -> list[Any]:
    if len(items) != n:
        raise SpecError(f"{what}: expected {n} (one per action request), got {len(items)}")
    return items


def _ask_decision(d: Any) -> str:
    kind = d.get("type") if isinstance(d, dict) else None
    if kind not in ("respond", "reject"):
        raise SpecError(f"decision {kind!r} is not allowed for a question (respond or reject)")
    return str(d.get("message") or "")


def _legacy_answer(d: dict[str, Any]) -> str:
    kind = d.get("type")
    if kind == "response":
        return str(d.get("args") or "")
    if kind == "ignore":
        return ""
    raise SpecError(f"response type {kind!r} is not allowed for a question (response or ignore)")


def _approval_resume(pending: Row, value: Any) -> Approve:
    items = list(pending.get("items") or [])
    ids = [str(it["call_id"]) for it in items]
    if value is True:
        return Approve("all")
    if value is False:
        return Approve([], ids)
    if isinstance(value, dict) and "approve" in value:
        return _native_approval(value)
    if isinstance(value, dict) and isinstance(value.get("decisions"), list):
        pairs = zip(items, _counted(value["decisions"], len(ids), "decisions"), strict=True)
        return approval_of([_approval_decision(it, d) for it, d in pairs])
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        pairs = zip(items, _counted(value, len(ids), "responses"), strict=True)
        return approval_of([_legacy_decision(it, d) for it, d in pairs])
    raise SpecError(
        "this interrupt is an approval: resume with decisions (approve, edit or reject), "
        "true, false or {'approve': 'all' | [call ids], 'reject': [...]}"
    )


def _native_approval(value: dict[str, Any]) -> Approve:
    approve = value["approve"]
    if approve != "all" and not isinstance(approve, list):
        raise SpecError("approve: 'all' or a list of call ids")
    reject = value.get("reject") or []
    note = value.get("note")
    return Approve(
        approve if approve == "all" else _strings(approve, "approve"),
        _strings(list(reject), "reject"),
        str(note) if note else None,
    )


def _approval_decision(item: Row, d: Any) -> ItemDecision:
    """The current convention: approve; edit (``edited_action.args``, the same tool);
    reject or respond (the message is what the model reads: ``Declined by user: …``)."""
    kind = d.get("type") if isinstance(d, dict) else None
    if kind == "approve":
        return decision(item, "approve")
    if kind in ("reject", "respond"):
        return decision(item, "reject", message=d.get("message"))
    if kind == "edit":
        action = d.get("edited_action")
        if not isinstance(action, dict):
            raise SpecError("an edit decision needs edited_action: {name, args}")
        return _edited(item, action.get("name"), action.get("args"))
    raise SpecError(f"decision {kind!r} is not allowed here (approve, edit or reject)")


def _legacy_decision(item: Row, d: dict[str, Any]) -> ItemDecision:
    kind = d.get("type")
    if kind == "accept":
        return decision(item, "approve")
    if kind == "ignore":
        return decision(item, "reject")
    if kind == "response":
        return decision(item, "reject", message=d.get("args"))
    if kind == "edit":
        action = d.get("args")
        if not isinstance(action, dict):
            raise SpecError("an edit response needs args: {action, args}")
        return _edited(item, action.get("action"), action.get("args"))
    raise SpecError(
        f"response type {kind!r} is not allowed here (accept, edit, ignore or response)"
    )


def _edited(item: Row, name: Any, args: Any) -> ItemDecision:
    if name not in (None, "", item["tool"]):
        raise SpecError(f"an edit cannot change the tool ({item['tool']!r}, not {name!r})")
    if not isinstance(args, dict):
        raise SpecError(f"the edited arguments of {item['tool']} must be an object")
    return decision(item, "edit", arguments=args)


def decision(
    item: Row, action: str, message: Any = None, arguments: dict[str, Any] | None = None
) -> ItemDecision:
    """One item's decision, checked (a bad field is a 422, nothing written)."""
    text = str(message) if message not in (None, "") else None
    try:
        return ItemDecision.model_validate(
            {
                "call_id": str(item["call_id"]),
                "action": action,
                "message": text,
                "arguments": arguments,
            }
        )
    except ValidationError as exc:
        problems = "; ".join(str(e.get("msg")) for e in exc.errors())
        raise SpecError(f"decision for call {item['call_id']}: {problems}") from None


def approval_of(decided: list[ItemDecision], note: str | None = None) -> Approve:
    """Per-item decisions as an ``Approve`` (the approve/reject lists for the record)."""
    return Approve(
        [d.call_id for d in decided if d.action != "reject"],
        [d.call_id for d in decided if d.action == "reject"],
        note,
        decided,
    )
