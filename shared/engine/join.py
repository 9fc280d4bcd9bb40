"""The join: a tool call's end, or a child run's end, closes the call and decrements the run's
``open_calls``; whoever brings it to 0 appends the batch's tool messages in call order and
settles what the round decided (``shared.engine.change.settle``) — or ends the loop when one of
the batch's tools said stop (L-6). One transaction (``Tx``), so exactly one finisher joins.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shared.agent.approval import note_message
from shared.agent.decisions import After, Fail
from shared.agent.step import SKIPPED_AFTER_STOP, stopped_at_join
from shared.engine.change import (
    Change,
    Finished,
    LostRace,
    decode_after,
    finish_events,
    flush,
    settle,
)
from shared.engine.tx import Tx
from shared.store import calls as call_store
from shared.store.rows import Call, CallStatus, Run
from shared.store.write import Closing, Inc

__all__ = ["finish_call"]


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
    events = finish_events(call.call_id, call.name, done)
    if alone:  # the only call of its round: closed and joined in one statement (guarded:
        # the call still in ``from_status`` at its attempt, the run's batch still open)
        closing = Closing([call.call_id], values, tuple(from_status), attempts)
        closed = Call.of({**_call_dict(call), **values, "flushed": False})  # flushed by this
        return _join(
            tx, run, call.round, [closed], done.cost, events, ask_timeout_s, closing=closing
        )
    if (
        call_store.set_calls(
            tx.conn, run.id, [call.call_id], values, from_status=from_status, attempts=attempts
        )
        != 1
    ):
        raise LostRace(run.id)
    change = Change(run, bump=False)
    skipped = _skip_later(tx, run, call) if done.stop else 0
    change.values.update(open_calls=Inc(-1 - skipped), cost=Inc(done.cost))
    change.events += events
    if done.stop:  # a later finisher must end the run too: the decision becomes a stop
        change.values["after_join"] = {**batch, "stop": True}
    nxt = None if done.stop else call_store.next_pending(tx.conn, run.id, call.round, tx.ts)
    if nxt is not None:
        change.queue_tools.append(nxt)
    new = tx.apply(change)
    if new.open_calls > 0:
        return new
    calls = call_store.list_tool_calls(tx.conn, run.id, call.round)
    return _join(tx, new, call.round, calls, 0.0, [], ask_timeout_s)


def _skip_later(tx: Tx, run: Run, stopper: Call) -> int:
    """L-6: a tool said stop, so the reply's later calls that have not started (pending, or
    queued: their tool task finds them done and drops its message) are not run: each is
    done with ``SKIPPED_AFTER_STOP`` as its result, marked ``skipped`` in its data. Calls
    already running finish. Returns how many were skipped."""
    later = [
        c.call_id
        for c in call_store.list_tool_calls(tx.conn, run.id, stopper.round)
        if c.idx > stopper.idx and c.status in _NOT_STARTED
    ]
    if not later:
        return 0
    values = {
        "status": CallStatus.DONE.value,
        "result": SKIPPED_AFTER_STOP,
        "result_for_model": SKIPPED_AFTER_STOP,
        "data": {"skipped": "stop"},
        "finished_at": tx.ts,
    }
    return call_store.set_calls(tx.conn, run.id, later, values, from_status=_NOT_STARTED)


_NOT_STARTED = (CallStatus.PENDING, CallStatus.QUEUED)


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
    closing: Closing | None = None,
) -> Run:
    """All calls of the batch are done: their tool messages in call order, then what the
    round decided — or the end of the loop if a tool said stop. ``closing``: the batch's
    last call, closed by this change (its run's batch guarded to be still open on it)."""
    after, skipped = _after(run, calls)
    if skipped:
        calls = _skip(tx, run, calls, skipped)
    msgs, flushed = flush(calls)
    if flushed and closing is None:
        call_store.set_calls(tx.conn, run.id, flushed, {"flushed": True})
    change = Change(run, events=list(events))
    if closing is not None:
        change.closes.append(closing)
        change.guard["open_calls"] = 1
        change.values["cost"] = Inc(cost)
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
        call_store.set_calls(tx.conn, run.id, [c.call_id], values)
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
