"""Every state change of a run passes through this module.

A transition is one database transaction (``Tx``) in which one or more ``Change``s are applied,
each to one run, by ``Tx.apply``:

1. **Locks, in one order.** A change that ends a run on a thread locks the thread row first;
   one that ends, pauses or resumes a child run then locks its lineage, root first (for each
   ancestor: the call that leads down, then its runs row); then the run's own tool-call rows,
   then its runs row. ``Tx.prepare`` takes the first two before a caller touches any row of
   the run; ``apply`` takes them itself when nobody did.
2. **The guard.** One UPDATE of the hot row, ``WHERE version = V`` (and the lease owner, when
   the caller holds the round): it also allocates message and event sequence numbers. No row
   means someone else moved the run: ``LostRace``, the one way to say it. The whole
   transaction rolls back.
3. **Append-only inserts**: messages (with their token estimates), events (and the webhook
   deliveries they fire), usage rows, new tool-call rows.
4. **What follows, in the same transaction**: a child that ends or pauses tells its parent
   (``shared.engine.children``: the parent's join, or its surfaced pause); a run that ends on a
   thread releases the thread's next held run (``shared.engine.threads``).
5. **After the commit** (never before, never on rollback): the dispatches are published — the
   broker is only a doorbell, a lost one is re-sent by the reaper from the state itself —, the
   runs' SSE tails are woken, and the runs that paused or ended leave this process's caches.

There is no outbox row for rounds and tool calls: the state says what is due (a runnable run
with no live lease and no open calls is due for a round; a ``queued`` call is due for its tool
task), and the reaper re-sends what nobody took.

The join lives here too (``finish_call``): a tool call's end, or a child run's end, closes the
call and decrements ``open_calls``; whoever brings it to 0 appends the batch's tool messages in
call order and settles what the round decided (``settle``).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from sqlalchemy.engine import Connection

from shared.agent.approval import note_message
from shared.agent.decisions import After, AwaitAnswer, AwaitApproval, Continue, Fail, Finish
from shared.agent.messages import Message
from shared.agent.step import stopped_at_join
from shared.engine import cache
from shared.engine.runtime import Dispatch, Runtime
from shared.errors import Conflict
from shared.store import deliveries, repo
from shared.store.rows import FINAL, RUNNABLE, Call, CallStatus, Run, Status

__all__ = [
    "finish_events",
    "Change",
    "LostRace",
    "Tx",
    "decode_after",
    "encode_after",
    "finish_call",
    "flush",
    "in_place",
    "retrying",
    "settle",
    "transaction",
]

log = logging.getLogger("treadle.transition")
T = TypeVar("T")


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
    closes: list[repo.Closing] = field(default_factory=list)  # values set on its calls
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

    def event(self, type_: str, **data: Any) -> None:
        self.events.append((type_, data))

    def message(self, msg: Message, round_: int) -> None:
        self.messages.append((msg, round_))

    @property
    def status(self) -> Status | None:
        status = self.values.get("status")
        return Status(status) if status is not None else None


def _tells_parent(run: Run, status: Status | None) -> bool:
    """A child run ending, pausing or resuming: its parent's status follows."""
    if run.parent_run_id is None or status is None:
        return False
    resumed = run.status == Status.WAITING and status != Status.WAITING
    return status in FINAL or status == Status.WAITING or resumed


def _frees_slot(run: Run, status: Status | None) -> bool:
    """A top-level run in flight ends or pauses: its tenant has room for one more run
    (``shared.engine.admission``)."""
    if run.parent_run_id is not None or status is None or status == run.status:
        return False
    return run.status in RUNNABLE and status not in RUNNABLE


class Tx:
    """One transaction: its connection and time, the locks taken, and what to publish and
    wake once it has committed."""

    def __init__(self, rt: Runtime, conn: Connection, ts: float) -> None:
        self.rt, self.conn, self.ts = rt, conn, ts
        self.out: list[Dispatch] = []
        self.wakes: dict[str, int | None] = {}
        self.stopped: list[str] = []  # runs whose in-flight work must stop (cancelled)
        self.settled: set[str] = set()  # runs that paused or ended: the caches drop them
        # messages this transaction appended: (run, view start, first seq, messages)
        self.appended: list[tuple[str, int, int, list[Message]]] = []
        self._threads: set[str] = set()
        self._lineages: set[str] = set()

    # --- locks --------------------------------------------------------------------------------

    def lock_thread(self, thread_id: str, tenant: str | None = None) -> Mapping[Any, Any]:
        """The thread's row lock, first of all (see the module docstring)."""
        from shared.engine import threads  # threads applies changes through this module

        row = threads.lock(self.conn, thread_id, self.ts, tenant)
        self._threads.add(thread_id)
        return row

    def lock_lineage(self, run: Run, *, ending: bool) -> Run | None:
        """The ancestors' locks, root first; returns the parent's fresh row."""
        from shared.engine import children  # children applies changes through this module

        parent = children.lock_lineage(self, run.id, ending=ending)
        self._lineages.add(run.id)
        return parent

    def prepare(self, run: Run, *, ending: bool, tells_parent: bool) -> None:
        """Take the locks a change of ``run`` may need before touching any of its rows."""
        if ending and run.thread_id and run.thread_id not in self._threads:
            self.lock_thread(run.thread_id)
        if tells_parent and run.parent_run_id and run.id not in self._lineages:
            self.lock_lineage(run, ending=ending)

    # --- apply --------------------------------------------------------------------------------

    def apply(self, change: Change) -> Run:
        """Apply ``change`` (see the module docstring); raises ``LostRace``."""
        run, status = change.run, change.status
        ending = status in FINAL
        releases = ending and change.release_thread and run.thread_id is not None
        tells = _tells_parent(run, status)
        self.prepare(run, ending=ending and change.release_thread, tells_parent=tells)
        tokens = repo.message_tokens(change.messages)
        new = self._update(change, tokens)
        if change.queue_round and new.steer and "steer" not in change.values:
            new = self._posted(change, new)
        self._inserted(change, new)
        if change.messages:
            first = new.msg_seq - len(change.messages) + 1
            self.appended.append((new.id, new.view_start, first, [m for m, _ in change.messages]))
        if ending or status == Status.WAITING:
            self.settled.add(run.id)
        if _frees_slot(run, status):  # the tenant's next run waiting for admission starts
            from shared.engine import admission

            admission.release(self, run.tenant)
        if change.queue_round:
            self.out.append(Dispatch.round(run.id, new.version, priority=new.priority))
        self.out += [
            Dispatch.tool(run.id, c, new.version, priority=new.priority) for c in change.queue_tools
        ]
        if tells:
            from shared.engine import children

            children.after_change(self, new)
        if releases and run.thread_id:
            from shared.engine import threads

            threads.release_next(self, run.thread_id, after=run.id)
        return new

    def _update(self, change: Change, tokens: list[int]) -> Run:
        """The guarded UPDATE and the change's rows (messages, events, usage, calls): one
        statement on PostgreSQL (``repo.Beside``)."""
        values = dict(change.values)
        if change.queue_round:  # when its dispatch goes out (the reaper's clock for it)
            values.setdefault("dispatched_at", self.ts)
        if tokens and "view_tokens" not in values:
            values["view_tokens"] = repo.Inc(sum(tokens))
        beside = repo.rows_beside(
            change.run.id,
            self.ts,
            messages=change.messages,
            tokens=tokens,
            events=change.events,
            usage=change.usage,
            calls=change.calls,
        )
        new = repo.update_run(
            self.conn,
            change.run.id,
            change.run.version,
            values,
            owner=change.owner,
            guard=change.guard,
            bump=change.bump,
            new_messages=len(change.messages),
            new_events=len(change.events),
            ts=self.ts,
            beside=beside,
            closing=change.closes,
        )
        if new is None:
            raise LostRace(change.run.id)
        return new

    def _posted(self, change: Change, new: Run) -> Run:
        """Messages posted to the run while it worked or waited (``runs.steer``, read by the
        guarded UPDATE, which holds the row: a poster waits for it) go in after the change's
        own messages (the batch's tool messages, an answer), so the next request has them."""
        round_ = int(change.values.get("round", change.run.round))
        posted = [(Message(role="user", content=p["content"]), round_) for p in new.steer or []]
        more = repo.message_tokens(posted)
        moved = repo.update_run(
            self.conn,
            new.id,
            new.version,
            {"steer": None, "view_tokens": repo.Inc(sum(more))},
            bump=False,
            new_messages=len(posted),
            ts=self.ts,
        )
        if moved is None:  # the row is held by this transaction: cannot happen
            raise LostRace(new.id)
        first = moved.msg_seq - len(posted) + 1
        repo.insert_messages(self.conn, moved.id, first, posted, self.ts, more)
        change.messages += posted
        return moved

    def _inserted(self, change: Change, new: Run) -> None:
        """The change's events are in (``_update``): wake the run's tails, fire its webhooks."""
        if change.events:
            first = new.event_seq - len(change.events) + 1
            self.wakes[new.id] = new.event_seq
            if new.webhook:
                self._webhooks(new, [(first + i, t, d) for i, (t, d) in enumerate(change.events)])

    def _webhooks(self, run: Run, numbered: Sequence[tuple[int, str, dict[str, Any]]]) -> None:
        row = {**run, "status": run.status.value, "meta": repo.run_meta(self.conn, run.id)}
        items = deliveries.record_webhooks(
            self.conn, row, numbered, self.ts, self.rt.settings.redrive_seconds
        )
        for outbox_id, _kind, payload in items:
            self.out.append(
                Dispatch(
                    "webhook",
                    run.id,
                    run.version,
                    delivery_id=payload["delivery_id"],
                    outbox_id=outbox_id,
                )
            )

    def record_event(self, run: Run, type_: str, data: dict[str, Any]) -> None:
        """One event at ``run.event_seq``, a seq the caller's UPDATE already took (a claim)."""
        repo.insert_events(self.conn, run.id, run.event_seq, [(type_, data)], self.ts)
        self.recorded(run, type_, data)

    def recorded(self, run: Run, type_: str, data: dict[str, Any]) -> None:
        """The event at ``run.event_seq`` is written (a round claim writes its own): wake the
        run's tails after the commit, and fire its webhooks."""
        self.wakes[run.id] = run.event_seq
        if run.webhook:
            self._webhooks(run, [(run.event_seq, type_, data)])

    def wake(self, run_id: str, seq: int | None = None) -> None:
        self.wakes[run_id] = seq

    # --- after the commit ---------------------------------------------------------------------

    def after_commit(self) -> None:
        for run_id, view_start, first, msgs in self.appended:  # the next round reads nothing
            cache.remember(run_id, view_start, first, msgs)
        if self.settled:
            cache.forget(self.settled)
        out = _hold(self.out)
        if out:
            self.rt.publish(out)
        for run_id, seq in self.wakes.items():
            self.rt.wake(run_id, seq)
        if self.stopped:  # work in flight of the runs this transaction ended: stop it
            from shared.engine.stopper import STOP_TOPIC, stop_message

            try:
                self.rt.live.publish(STOP_TOPIC, stop_message(self.stopped))
            except Exception:
                log.warning("stop signal failed for %s", self.stopped, exc_info=True)


class _Hand(threading.local):
    """This thread's hand-off: the run whose next round it drives itself, and that round."""

    run_id: str | None = None
    held: Dispatch | None = None


_hand = _Hand()


@contextmanager
def in_place(rt: Runtime, run_id: str) -> Iterator[Callable[[], Dispatch | None]]:
    """While the block runs, the first round of ``run_id`` that a commit in this thread makes
    due at once (no countdown) is held back from the broker; ``take()`` hands it to the block
    to drive here. What is still held when the block ends, or fails, is published. Nested:
    the outer block holds, the inner ``take`` finds nothing."""
    if _hand.run_id is not None:
        yield lambda: None
        return
    _hand.run_id, _hand.held = run_id, None
    try:
        yield _take
    finally:
        held, _hand.run_id, _hand.held = _hand.held, None, None
        if held is not None:
            rt.publish([held])


def _take() -> Dispatch | None:
    held, _hand.held = _hand.held, None
    return held


def _hold(out: list[Dispatch]) -> list[Dispatch]:
    """``out`` without the round this thread's hand-off keeps (``in_place``)."""
    run_id = _hand.run_id
    if run_id is None or _hand.held is not None:
        return out
    for i, d in enumerate(out):
        if d.kind == "round" and d.run_id == run_id and not d.countdown:
            _hand.held = d
            return out[:i] + out[i + 1 :]
    return out


@contextmanager
def transaction(rt: Runtime) -> Iterator[Tx]:
    """A transition's transaction; publishes and wakes after a successful commit."""
    with rt.engine.begin() as conn:
        tx = Tx(rt, conn, repo.now())
        yield tx
    tx.after_commit()


def attempt(rt: Runtime, op: Callable[[Tx], T]) -> T | None:
    """``op`` in one transaction; None when it lost a race (rolled back)."""
    try:
        with transaction(rt) as tx:
            return op(tx)
    except LostRace:
        return None


def retrying(rt: Runtime, op: Callable[[Tx], T], tries: int = 20) -> T:
    """``op`` in a transaction, read again and retried while it loses races (the API's
    commands: a person's answer must not fail because a tool finished at the same time)."""
    for _ in range(tries):
        try:
            with transaction(rt) as tx:
                return op(tx)
        except LostRace:
            continue
    raise Conflict("the run kept changing; try again")


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
    return Fail(reason=d.get("reason", ""), code=d.get("code", "failed"))


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
        change.event("run.waiting", pending=pending)
    elif isinstance(after, AwaitApproval):
        pending = {
            "kind": "approval",
            "approval_id": f"apr_{uuid.uuid4().hex[:16]}",
            "items": list(after.items),
            "asked_at": ts,
        }
        v.update(status=Status.WAITING.value, pending=pending)
        change.event("run.waiting", pending=pending)
    elif isinstance(after, Finish):
        result = {"text": after.text, **after.result}
        v.update(
            status=Status.COMPLETED.value,
            stop_reason=after.stop_reason,
            pending=None,
            result=result,
        )
        change.event("run.completed", stop_reason=after.stop_reason, result=result)
    else:
        error = {"code": after.code, "message": after.reason}
        v.update(status=Status.FAILED.value, stop_reason=after.code, pending=None, error=error)
        change.event("run.failed", error=error)


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


# --- the join ---------------------------------------------------------------------------------


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
    events = [("tool.started", done.started)] if done.started else []
    events.append(("tool.finished", {**event, **done.event}))
    return events


def finish_call(
    tx: Tx,
    run: Run,
    call: Call,
    done: Finished,
    *,
    from_status: Sequence[CallStatus],
    attempts: int | None = None,
    ask_timeout_s: float | None = None,
) -> Run:
    """Close one call of the run's batch (guarded by its status, and by its attempt when a
    worker claimed it); the batch's last call joins. Raises ``LostRace``."""
    batch = dict(run.after_join or {})
    alone = run.open_calls == 1 and int(batch.get("calls", 0)) == 1
    values: dict[str, Any] = {
        "status": CallStatus.DONE.value,
        "result": done.text,
        "result_for_model": done.for_model,
        "cost": done.cost,
        "data": {**(call.data or {}), **(done.data or {}), **({"stop": True} if done.stop else {})},
        "finished_at": tx.ts,
        "lease_owner": None,
        "flushed": alone,
    }
    if (
        repo.close_calls(
            tx.conn, run.id, [call.call_id], values, from_status=from_status, attempts=attempts
        )
        != 1
    ):
        raise LostRace(run.id)
    events = finish_events(call.call_id, call.name, done)
    if alone:  # the only call of its round: join in one UPDATE (guarded: still the last)
        closed = Call.of({**_call_dict(call), **values, "flushed": False})  # flushed by this
        return _join(tx, run, call.round, [closed], done.cost, events, ask_timeout_s, last=True)
    change = Change(run, bump=False)
    change.values.update(open_calls=repo.Inc(-1), cost=repo.Inc(done.cost))
    change.events += events
    if done.stop:  # a later finisher must end the run too: the decision becomes a stop
        change.values["after_join"] = {**batch, "stop": True}
    nxt = repo.next_pending(tx.conn, run.id, call.round, tx.ts)
    if nxt is not None:
        change.queue_tools.append(nxt)
    new = tx.apply(change)
    if new.open_calls > 0:
        return new
    calls = repo.list_tool_calls(tx.conn, run.id, call.round)
    return _join(tx, new, call.round, calls, 0.0, [], ask_timeout_s, last=False)


def _call_dict(call: Call) -> dict[str, Any]:
    return {f: getattr(call, f) for f in Call.__dataclass_fields__}


def _join(
    tx: Tx,
    run: Run,
    round_: int,
    calls: Sequence[Call],
    cost: float,
    events: list[tuple[str, dict[str, Any]]],
    ask_timeout_s: float | None,
    *,
    last: bool,
) -> Run:
    """All calls of the batch are done: their tool messages in call order, then what the
    round decided — or the end of the loop if a tool said stop."""
    after, skipped = _after(run, calls)
    if skipped:
        calls = _skip(tx, run, calls, skipped)
    msgs, flushed = flush(calls)
    if flushed and not last:
        repo.close_calls(tx.conn, run.id, flushed, {"flushed": True})
    change = Change(run, events=list(events))
    if last:
        change.guard["open_calls"] = 1
        change.values["cost"] = repo.Inc(cost)
    for m in msgs:
        change.message(m, round_)
    noted = note_message((run.after_join or {}).get("note"))
    if noted is not None:  # the approver's note, after the batch's tool messages
        change.message(noted, round_)
    settle(change, after, ts=tx.ts, ask_timeout_s=ask_timeout_s)
    return tx.apply(change)


def _skip(tx: Tx, run: Run, calls: Sequence[Call], texts: Mapping[str, str]) -> list[Call]:
    """A tool said stop while other calls of the reply wait (an ask, writes awaiting
    approval): each still gets its tool message."""
    out = []
    for c in calls:
        text = texts.get(c.call_id)
        if text is None or c.status == CallStatus.DONE:
            out.append(c)
            continue
        values = {
            "status": CallStatus.DONE.value,
            "result": text,
            "result_for_model": text,
            "finished_at": tx.ts,
        }
        repo.close_calls(tx.conn, run.id, [c.call_id], values)
        out.append(Call.of({**_call_dict(c), **values}))
    return out


def _after(run: Run, calls: Sequence[Call]) -> tuple[After | Fail, dict[str, str]]:
    """What the round decided, unless one of its tools ended the loop (L-6: then the run ends
    ``stop_tool``, and the calls the pause would have answered get their skip texts)."""
    after = decode_after(run.after_join)
    stopper = next((c for c in reversed(calls) if (c.data or {}).get("stop")), None)
    if stopper is None and not (run.after_join or {}).get("stop"):
        return after, {}
    if isinstance(after, Fail):
        return after, {}
    text = stopper.model_text if stopper is not None else ""
    return stopped_at_join(after, text)
