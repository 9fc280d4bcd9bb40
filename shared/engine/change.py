"""What a transition does to one run, as a value (the bottom of the kernel: no database, no
broker). A ``Change`` is built by whoever moves a run (a round, a tool's end, a command) and
applied by a transaction (``shared.engine.tx.Tx.apply``); ``settle`` fills one with what a
round decided, ``flush`` turns finished calls into tool messages in call order, and
``LostRace`` is the one way to say the run moved on meanwhile.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from shared.agent.decisions import After, AwaitAnswer, AwaitApproval, Continue, Fail, Finish
from shared.agent.messages import Message
from shared.store.rows import FINAL, RUNNABLE, Call, CallStatus, Run, Status
from shared.store.write import Closing, Inc
from shared.vocab import EventType

__all__ = [
    "Change",
    "Finished",
    "LostRace",
    "decode_after",
    "encode_after",
    "finish_events",
    "flush",
    "frees_slot",
    "settle",
    "tells_parent",
]


class LostRace(Exception):  # noqa: N818 - control flow, not an error
    """The run moved on under this transaction: roll it back (and maybe read again)."""


@dataclass
class Change:
    """What one transition does to one run (read at ``run.version``)."""

    run: Run
    values: dict[str, Any] = field(default_factory=dict)
    messages: list[tuple[Message, int]] = field(default_factory=list)  # (message, round)
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    usage: list[dict[str, Any]] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)  # new tool_calls rows
    closes: list[Closing] = field(default_factory=list)  # values set on its calls
    queue_round: bool = False
    queue_tools: list[str] = field(default_factory=list)
    bump: bool = True
    owner: str | None = None  # the lease owner that must still hold the round
    guard: dict[str, Any] = field(default_factory=dict)  # more WHERE column = value
    release_thread: bool = True  # a run ending on a thread starts the thread's next run

    @classmethod
    def by_holder(cls, run: Run, owner: str, *, failing: bool = False) -> Change:
        """A change by the worker holding the run's round, guarded by its lease: it ends the
        round's attempt, so the run's attempts go back to 0 (L-12) — unless the run fails
        here (``failing``): then they stay, with the last error, as the record of why."""
        values: dict[str, Any] = {} if failing else {"attempts": 0, "last_error": None}
        return cls(run, values=values, owner=owner)

    def copy(self) -> Change:
        """A copy whose lists and dicts are its own (a retried apply starts from this one)."""
        return replace(
            self,
            values=dict(self.values),
            messages=list(self.messages),
            events=list(self.events),
            usage=list(self.usage),
            calls=[dict(c) for c in self.calls],
            closes=list(self.closes),
            queue_tools=list(self.queue_tools),
            guard=dict(self.guard),
        )

    def bill(self, calls: Sequence[Mapping[str, Any]]) -> None:
        """Model calls the provider bills, in ``/usage`` and added to the run's cost (calls
        whose reply the run does not keep: a broken stream's, L-12)."""
        if calls:
            self.usage += [dict(c) for c in calls]
            self.values["cost"] = Inc(sum(float(c.get("cost") or 0.0) for c in calls))

    def event(self, type_: str, **data: Any) -> None:
        self.events.append((type_, data))

    def message(self, msg: Message, round_: int) -> None:
        self.messages.append((msg, round_))

    @property
    def status(self) -> Status | None:
        status = self.values.get("status")
        return Status(status) if status is not None else None


def tells_parent(run: Run, status: Status | None) -> bool:
    """A child run ending, pausing or resuming: its parent's status follows."""
    if run.parent_run_id is None or status is None:
        return False
    resumed = run.status == Status.WAITING and status != Status.WAITING
    return status in FINAL or status == Status.WAITING or resumed


def frees_slot(run: Run, status: Status | None) -> bool:
    """A top-level run in flight ends or pauses: its tenant has room for one more run."""
    if run.parent_run_id is not None or status is None or status == run.status:
        return False
    return run.status in RUNNABLE and status not in RUNNABLE


# --- what a round decided, once its calls are done -------------------------------------------


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
    if t == "fail":
        return Fail(reason=d.get("reason", ""), code=d.get("code", "failed"))
    raise ValueError(f"after_join type {t!r} is not known to this code (written by a newer one?)")


def settle(
    change: Change,
    after: After | Fail,
    *,
    ts: float,
    ask_timeout_s: float | None = None,
) -> None:
    """Fill ``change`` with what ``after`` does to the run: its next status, its pause, the
    events, the next round."""
    v = change.values
    v.update(after_join=None, lease_owner=None, open_calls=0, wake_at=None)
    if isinstance(after, Continue):
        v.update(status=Status.RUNNING.value, pending=None)
        change.queue_round = True
    elif isinstance(after, AwaitAnswer):
        expires = ts + ask_timeout_s if ask_timeout_s else None
        pending = {"kind": "ask", **after.ask, "asked_at": ts, "expires_at": expires}
        v.update(status=Status.WAITING.value, pending=pending, wake_at=expires)
        change.event(EventType.RUN_WAITING, pending=pending)
    elif isinstance(after, AwaitApproval):
        pending = {
            "kind": "approval",
            "approval_id": f"apr_{uuid.uuid4().hex[:16]}",
            "items": list(after.items),
            "asked_at": ts,
        }
        v.update(status=Status.WAITING.value, pending=pending)
        change.event(EventType.RUN_WAITING, pending=pending)
    elif isinstance(after, Finish):
        result = {"text": after.text, **after.result}
        v.update(
            status=Status.COMPLETED.value,
            stop_reason=after.stop_reason,
            pending=None,
            result=result,
        )
        change.event(EventType.RUN_COMPLETED, stop_reason=after.stop_reason, result=result)
    else:
        error = {"code": after.code, "message": after.reason}
        v.update(status=Status.FAILED.value, stop_reason=after.code, pending=None, error=error)
        change.event(EventType.RUN_FAILED, error=error)


def flush(calls: Sequence[Call]) -> tuple[list[Message], list[str]]:
    """Tool messages for finished, unflushed calls in call order, up to the first unfinished."""
    out: list[Message] = []
    ids: list[str] = []
    for c in sorted(calls, key=lambda c: c.idx):
        if c.flushed:
            continue
        if c.status != CallStatus.DONE:
            break
        out.append(Message(role="tool", content=c.model_text, tool_call_id=c.call_id, name=c.name))
        ids.append(c.call_id)
    return out, ids


@dataclass(frozen=True)
class Finished:
    """How one call ended: the values for its row and what the ``tool.finished`` event says."""

    text: str
    for_model: str
    cost: float = 0.0
    data: dict[str, Any] | None = None
    stop: bool = False  # the tool ends the loop (no further model call)
    event: dict[str, Any] = field(default_factory=dict)
    started: dict[str, Any] | None = None  # a call run unclaimed: its tool.started event


def finish_events(call_id: str, name: str, done: Finished) -> list[tuple[str, dict[str, Any]]]:
    """The events a finished call writes: ``tool.started`` (a call run unclaimed) and
    ``tool.finished``."""
    event = {"call_id": call_id, "name": name, "preview": done.text[:300], "cost": done.cost}
    events: list[tuple[str, dict[str, Any]]] = []
    if done.started:
        events.append((EventType.TOOL_STARTED, done.started))
    events.append((EventType.TOOL_FINISHED, {**event, **done.event}))
    return events
