"""Encoding of the join continuation (``runs.after_join``) and the settle step: append the
finished tool messages in call order, then do what the round decided."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from shared.agent.decisions import After, AwaitAnswer, AwaitApproval, Continue, Fail, Finish
from shared.agent.messages import Message
from shared.store.repo import Changes

__all__ = ["decode_after", "encode_after", "flush_calls", "settle"]


def encode_after(after: After | Fail) -> dict[str, Any]:
    if isinstance(after, Continue):
        return {"type": "continue"}
    if isinstance(after, AwaitAnswer):
        return {"type": "ask", "ask": after.ask}
    if isinstance(after, AwaitApproval):
        return {"type": "approval", "items": list(after.items)}
    if isinstance(after, Finish):
        return {"type": "finish", "stop_reason": after.stop_reason, "text": after.text,
                "result": after.result}
    return {"type": "fail", "reason": after.reason, "code": after.code}


def decode_after(d: Mapping[str, Any] | None) -> After | Fail:
    if not d or d.get("type") == "continue":
        return Continue()
    t = d["type"]
    if t == "ask":
        return AwaitAnswer(ask=dict(d["ask"]))
    if t == "approval":
        return AwaitApproval(items=tuple(d["items"]))
    if t == "finish":
        return Finish(stop_reason=d["stop_reason"], text=d.get("text", ""),
                      result=dict(d.get("result") or {}))
    return Fail(reason=d.get("reason", ""), code=d.get("code", "failed"))


def flush_calls(calls: Sequence[Mapping[Any, Any]]) -> tuple[list[Message], list[str]]:
    """Tool messages for finished, unflushed calls in call order, up to the first unfinished."""
    out: list[Message] = []
    ids: list[str] = []
    for c in sorted(calls, key=lambda c: c["idx"]):
        if c.get("flushed"):
            continue
        if c["status"] != "done":
            break
        text = c.get("result_for_model")
        if text is None:
            text = c.get("result") or ""
        out.append(Message(role="tool", content=text or "(empty)", tool_call_id=c["call_id"],
                           name=c["name"]))
        ids.append(c["call_id"])
    return out, ids


def settle(
    changes: Changes,
    after: After | Fail,
    *,
    run_id: str,
    round_: int,
    ts: float,
    ask_timeout_s: float | None = None,
) -> None:
    """Fill ``changes`` with what ``after`` does to the run (status, pending, outbox, events)."""
    v = changes.values
    v.update(after_join=None, lease_until=None, lease_owner=None, open_calls=0, wake_at=None)
    if isinstance(after, Continue):
        v.update(status="running", pending=None)
        changes.outbox.append(("round", {}))
    elif isinstance(after, AwaitAnswer):
        pending = {"kind": "ask", **after.ask, "asked_at": ts,
                   "expires_at": ts + ask_timeout_s if ask_timeout_s else None}
        v.update(status="waiting", pending=pending, wake_at=pending["expires_at"])
        changes.event("run.waiting", pending=pending)
    elif isinstance(after, AwaitApproval):
        pending = {"kind": "approval", "approval_id": f"apr_{uuid.uuid4().hex[:16]}",
                   "items": list(after.items), "asked_at": ts}
        v.update(status="waiting", pending=pending)
        changes.event("run.waiting", pending=pending)
    elif isinstance(after, Finish):
        result = {"text": after.text, **after.result}
        v.update(status="completed", stop_reason=after.stop_reason, pending=None, result=result)
        changes.event("run.completed", stop_reason=after.stop_reason, result=result)
    else:
        error = {"code": after.code, "message": after.reason}
        v.update(status="failed", stop_reason=after.code, pending=None, error=error)
        changes.event("run.failed", error=error)
