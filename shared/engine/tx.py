"""One transaction of the kernel (``Tx``): its connection and time, the locks it took, the
changes it applied and what to publish and wake once it has committed.

``Tx.apply`` applies one ``Change`` (``shared.engine.change``) to one run:

1. **Locks, in one order.** A change that ends a run on a thread locks the thread row first;
   one that ends, pauses or resumes a child run then locks its ancestry, root first (for each
   ancestor: the call that leads down, then its runs row); then the run's own tool-call rows,
   then its runs row. ``prepare`` takes the first two before a caller touches any row of the
   run; ``apply`` takes them itself when nobody did.
2. **The guard.** One UPDATE of the hot row, ``WHERE version = V`` (and the lease owner, when
   the caller holds the round): it also allocates message and event sequence numbers. No row
   means someone else moved the run: ``LostRace``; the whole transaction rolls back.
3. **Append-only rows**: messages (with their token estimates), events (and the webhook
   deliveries they fire), usage rows, new tool-call rows — in the same statement on
   PostgreSQL.
4. **What follows**, in the same transaction: the transaction's ``follow_ups``, in their
   order, each given the applied change and returning further changes, applied the same way
   (``shared.engine.transition.FOLLOW_UPS`` is the list every transaction runs).
5. **After the commit** (never before, never on rollback): the dispatches are published, the
   runs' SSE tails are woken, the runs that paused or ended leave this process's caches, and
   the work in flight of runs this transaction cancelled is told to stop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Connection

from shared.agent.messages import Message
from shared.engine.change import Change, LostRace, tells_parent
from shared.engine.runtime import Dispatch, Runtime
from shared.engine.stopper import STOP_TOPIC, stop_message
from shared.errors import NotFound
from shared.store import ancestry, deliveries, records
from shared.store import runs as run_store
from shared.store import threads as thread_store
from shared.store.rows import FINAL, Run, RunRecord, Status
from shared.store.write import Inc, rows_beside

__all__ = ["Applied", "FollowUp", "Tx"]

log = logging.getLogger("treadle.transition")


@dataclass(frozen=True)
class Applied:
    """A change just applied: the run as it was read (``before``) and as it is now."""

    change: Change
    before: Run
    after: Run


FollowUp = Callable[["Tx", Applied], Sequence[Change]]
"""What a change entails in the same transaction: further changes (of this run or others)."""


class Tx:
    """One transaction: its connection and time, the locks taken, and what to publish and
    wake once it has committed."""

    def __init__(
        self, rt: Runtime, conn: Connection, ts: float, follow_ups: Sequence[FollowUp] = ()
    ) -> None:
        self.rt, self.conn, self.ts = rt, conn, ts
        self.follow_ups = tuple(follow_ups)
        self.out: list[Dispatch] = []
        self.wakes: dict[str, int | None] = {}
        self.stopped: list[str] = []  # runs whose in-flight work must stop (cancelled)
        self.settled: set[str] = set()  # runs that paused or ended: the caches drop them
        # messages this transaction appended: (run, view start, first seq, messages)
        self.appended: list[tuple[str, int, int, list[Message]]] = []
        self._threads: set[str] = set()
        self._lineages: set[str] = set()

    # --- reads ---------------------------------------------------------------------------------

    def run(self, run_id: str, tenant: str | None = None) -> Run:
        """The run's hot row (``tenant`` None: any tenant's). NotFound when there is none."""
        run = run_store.load_run(self.conn, run_id, tenant)
        if run is None:
            raise NotFound(f"run {run_id} not found")
        return run

    def record(self, run_id: str) -> RunRecord:
        """The run as the API shows it, as this transaction sees it now."""
        record = run_store.get_run(self.conn, run_id)
        assert record is not None
        return record

    # --- locks --------------------------------------------------------------------------------

    def lock_thread(self, thread_id: str, tenant: str | None = None) -> Mapping[Any, Any]:
        """The thread's row lock, first of all. NotFound for an unknown thread."""
        row = thread_store.lock_thread(self.conn, thread_id, self.ts, tenant)
        if row is None:
            raise NotFound(f"thread {thread_id} not found")
        self._threads.add(thread_id)
        return row

    def lock_lineage(self, run: Run, *, ending: bool) -> Run | None:
        """The ancestors' locks, root first (with the root's thread first when the change may
        end runs): for each ancestor the call that leads down, then its runs row. Returns
        the parent's fresh row (None: no parent)."""
        chain = ancestry.ancestors(self.conn, run.id)
        if ending and chain and chain[0].thread_id is not None:
            thread_store.lock_thread(self.conn, chain[0].thread_id, self.ts)
        parent: Run | None = None
        for link in chain:
            ancestry.lock_call(self.conn, link.run_id, link.call_id)
            parent = run_store.lock_run(self.conn, link.run_id)
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
        """Apply ``change``, then what it entails (see the module docstring); returns the run
        as it now is. Raises ``LostRace``."""
        before, status = change.run, change.status
        ending = status in FINAL
        self.prepare(
            before,
            ending=ending and change.release_thread,
            tells_parent=tells_parent(before, status),
        )
        after = self._write(change)
        applied = Applied(change, before, after)
        for follow_up in self.follow_ups:
            for more in follow_up(self, applied):
                moved = self.apply(more)
                if moved.id == after.id:  # this run moved on (messages posted to it)
                    after = moved
        return after

    def _write(self, change: Change) -> Run:
        """The guarded UPDATE and the change's rows; what to publish and wake after."""
        run, status = change.run, change.status
        tokens = records.message_tokens(change.messages)
        new = self._update(change, tokens)
        self._inserted(change, new)
        if change.messages:
            first = new.msg_seq - len(change.messages) + 1
            self.appended.append((new.id, new.view_start, first, [m for m, _ in change.messages]))
        if status in FINAL or status == Status.WAITING:
            self.settled.add(run.id)
        if change.queue_round:
            self.out.append(Dispatch.round(run.id, new.version, priority=new.priority))
        self.out += [
            Dispatch.tool(run.id, c, new.version, priority=new.priority) for c in change.queue_tools
        ]
        return new

    def _update(self, change: Change, tokens: list[int]) -> Run:
        """The guarded UPDATE and the change's rows (messages, events, usage, calls): one
        statement on PostgreSQL (``Beside``)."""
        values = dict(change.values)
        if change.status is not None:  # when it ended: the search's ended range reads it
            ended = change.status in FINAL
            values.setdefault("ended_at", self.ts if ended else None)
            if ended:  # a suspend asked of it is moot
                values.setdefault("suspend_at", None)
        if change.queue_round:  # when its dispatch goes out (the reaper's clock for it)
            values.setdefault("dispatched_at", self.ts)
        if tokens and "view_tokens" not in values:
            values["view_tokens"] = Inc(sum(tokens))
        beside = rows_beside(
            change.run.id,
            self.ts,
            messages=change.messages,
            tokens=tokens,
            events=change.events,
            usage=change.usage,
            calls=change.calls,
        )
        new = self.rt.store.update_run(
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

    def _inserted(self, change: Change, new: Run) -> None:
        """The change's events are in (``_update``): wake the run's tails, fire its webhooks."""
        if change.events:
            first = new.event_seq - len(change.events) + 1
            self.wakes[new.id] = new.event_seq
            if new.webhook:
                self._webhooks(new, [(first + i, t, d) for i, (t, d) in enumerate(change.events)])

    def _webhooks(self, run: Run, numbered: Sequence[tuple[int, str, dict[str, Any]]]) -> None:
        row = {**run, "status": run.status.value, "meta": run_store.run_meta(self.conn, run.id)}
        items = deliveries.record_webhooks(
            self.conn, row, numbered, self.ts, self.rt.settings.redrive_seconds, self.rt.renderers
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

    def recorded(self, run: Run, type_: str, data: dict[str, Any]) -> None:
        """The event at ``run.event_seq`` is written (a round's or a call's claim writes its
        own): wake the run's tails after the commit, and fire its webhooks."""
        self.wakes[run.id] = run.event_seq
        if run.webhook:
            self._webhooks(run, [(run.event_seq, type_, data)])

    def wake(self, run_id: str, seq: int | None = None) -> None:
        self.wakes[run_id] = seq

    # --- after the commit ---------------------------------------------------------------------

    def after_commit(self) -> None:
        """Publish what the transaction made due, wake the tails, stop cancelled work."""
        for run_id, view_start, first, msgs in self.appended:  # the next round reads nothing
            self.rt.caches.remember(run_id, view_start, first, msgs)
        if self.settled:
            self.rt.caches.forget(self.settled)
        if self.out:
            self.rt.publish(self.out)
        for run_id, seq in self.wakes.items():
            self.rt.wake(run_id, seq)
        if self.stopped:  # work in flight of the runs this transaction ended: stop it
            try:
                self.rt.live.publish(STOP_TOPIC, stop_message(self.stopped))
            except Exception:
                log.warning("stop signal failed for %s", self.stopped, exc_info=True)
