"""Encoding of the join continuation (``runs.after_join``) and the settle step: append the
finished tool messages in call order, then do what the round decided. ``join_changes`` is the
join itself (whoever finishes a batch's last call: a tool task, or a child run's end) and
``next_pending`` dispatches the next call of a windowed batch."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, RowMapping

from shared.agent.decisions import After, AwaitAnswer, AwaitApproval, Continue, Fail, Finish
from shared.agent.messages import Message
from shared.store import repo
from shared.store.repo import Changes
from shared.store.tables import tool_calls

__all__ = [
    "decode_after",
    "encode_after",
    "flush_calls",
    "join_changes",
    "next_pending",
    "settle",
]


def encode_after(after: After | Fail) -> dict[str, Any]:
    if isinstance(after, Continue):
        return {"type": "continue"}
    if isinstance(after, AwaitAnswer):
        return {"type": "ask", "ask": after.ask}
    if isinstance(after, AwaitApproval):
        return {"type": "approval", "items": list(after.items)}
    if isinstance(after, Finish):
        return {
            "type": "finish",
            "stop_reason": after.stop_reason,
            "text": after.text,
            "result": after.result,
        }
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
        return Finish(
            stop_reason=d["stop_reason"], text=d.get("text", ""), result=dict(d.get("result") or {})
        )
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
        out.append(
            Message(
                role="tool", content=text or "(empty)", tool_call_id=c["call_id"], name=c["name"]
            )
        )
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
        pending = {
            "kind": "ask",
            **after.ask,
            "asked_at": ts,
            "expires_at": ts + ask_timeout_s if ask_timeout_s else None,
        }
        v.update(status="waiting", pending=pending, wake_at=pending["expires_at"])
        changes.event("run.waiting", pending=pending)
    elif isinstance(after, AwaitApproval):
        pending = {
            "kind": "approval",
            "approval_id": f"apr_{uuid.uuid4().hex[:16]}",
            "items": list(after.items),
            "asked_at": ts,
        }
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


def next_pending(conn: Connection, run_id: str, round_: int) -> str | None:
    """Serial or windowed batches: mark the next undispatched call queued and return its id.
    A call another transaction is dispatching right now is skipped (``SKIP LOCKED``), so two
    finishers queue two different calls and never wait on each other's rows."""
    nxt = conn.execute(
        sa.select(tool_calls.c.call_id)
        .where(
            tool_calls.c.run_id == run_id,
            tool_calls.c.round == round_,
            tool_calls.c.status == "pending",
        )
        .order_by(tool_calls.c.idx)
        .limit(1)
        .with_for_update(skip_locked=True)
    ).scalar()
    if nxt is None:
        return None
    done = conn.execute(
        sa.update(tool_calls)
        .where(
            tool_calls.c.run_id == run_id,
            tool_calls.c.call_id == nxt,
            tool_calls.c.status == "pending",
        )
        .values(status="queued")
    ).rowcount
    return str(nxt) if done == 1 else None


def join_changes(
    conn: Connection, run: RowMapping, round_: int, ts: float, ask_timeout_s: float | None
) -> Changes:
    """All calls of the batch are finished: append their messages in call order and settle
    what the round decided (``runs.after_join``)."""
    calls = repo.list_tool_calls(conn, run["id"], round_)
    msgs, flushed = flush_calls(calls)
    if flushed:
        conn.execute(
            sa.update(tool_calls)
            .where(tool_calls.c.run_id == run["id"], tool_calls.c.call_id.in_(flushed))
            .values(flushed=True)
        )
    changes = Changes()
    for m in msgs:
        changes.message(m, round_)
    settle(
        changes,
        decode_after(run["after_join"]),
        run_id=run["id"],
        round_=round_,
        ts=ts,
        ask_timeout_s=ask_timeout_s,
    )
    return changes
