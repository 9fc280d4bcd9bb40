"""What the LangGraph routes do to treadle (``Facade``, a route dependency): find a tenant's
thread, start a LangGraph run (a new treadle run, a resume of the thread's pause, or a fork
from an earlier checkpoint) as a segment, cancel it, read what it returned."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends
from sqlalchemy.engine import Connection

from scheduler.http.agents import resolve, store_lookup
from scheduler.http.auth import Caller
from scheduler.http.deps import RuntimeDep
from scheduler.interop.common import admit, facade_webhook, submit_facade_run
from scheduler.interop.langgraph.bodies import (
    NO_RESUME,
    LgInput,
    RunBody,
    ThreadBody,
)
from scheduler.interop.langgraph.stream import modes_of
from scheduler.interop.langgraph.views import final_values, round_at
from shared.engine import commands, lifecycle
from shared.engine import threads as thread_engine
from shared.engine.runtime import Runtime
from shared.errors import Conflict, NotFound, SpecError
from shared.interop.shapes import (
    Answer,
    decode_resume,
    input_messages,
    lg_run_status,
    pause_id,
)
from shared.interop.thread_ids import public_id, scoped_id
from shared.store import records
from shared.store import runs as run_store
from shared.store import segments as segs
from shared.store import threads as thread_store
from shared.store.db import reading
from shared.vocab import EventType

__all__ = ["PROTOCOL", "Facade"]

PROTOCOL = segs.LANGGRAPH


@dataclass(frozen=True)
class _Found:
    """The thread a new LangGraph run finds: its stored id (None: a stateless run's, not made
    yet), its active run (going or paused), whether a run waits in its queue, and the seq of
    the active run's last pause (where a resumed segment starts)."""

    key: str | None
    active: Mapping[Any, Any] | None = None
    queued: bool = False
    waited: int = 0


class _Facade:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def thread(self, conn: Connection, tenant: str, thread_id: str) -> Mapping[Any, Any]:
        """The tenant's thread its client calls ``thread_id``: one it named (stored under
        ``scoped_id``) or one the server named (stored as it is)."""
        row = thread_store.get_thread(conn, scoped_id(tenant, thread_id), tenant)
        row = row or thread_store.get_thread(conn, thread_id, tenant)
        if row is None:
            raise NotFound(f"thread {thread_id} not found")
        return row

    def leg(self, tenant: str, thread_id: str, run_id: str) -> segs.Leg:
        with reading(self.rt.engine) as conn:
            seg = segs.get_segment(conn, run_id, tenant, PROTOCOL)
            if seg is None or public_id(seg["thread_id"] or "") != thread_id:
                raise NotFound(f"run {run_id} not found on thread {thread_id}")
            return segs.load_leg(conn, seg)

    def create_thread(self, tenant: str, body: ThreadBody) -> Mapping[Any, Any]:
        """A thread named by the client lives in the tenant's namespace (``scoped_id``):
        another tenant's thread of the same name is neither seen nor in the way."""
        thread_id = scoped_id(tenant, body.thread_id) if body.thread_id else str(uuid.uuid4())
        with reading(self.rt.engine) as conn:
            found = thread_store.get_thread(conn, thread_id, tenant)
        if found is not None:
            if body.if_exists == "do_nothing":
                return found
            raise Conflict(f"thread {body.thread_id} already exists")
        return thread_engine.create_thread(self.rt, tenant, body.metadata, "enqueue", thread_id)

    def start(self, caller: Caller, thread_id: str | None, body: RunBody) -> segs.Leg:
        """Create a LangGraph run: a resume of the thread's pause, or a new treadle run.
        ``thread_id`` None: a stateless run, on a new thread made only if it is admitted."""
        if thread_id is None:  # a stateless run: its thread is made once the run is admitted
            if body.resume() is not NO_RESUME:
                raise Conflict("the thread has no pending interrupt to resume")
            return self._submit(caller, body, _Found(None))
        with reading(self.rt.engine) as conn:
            key = self.thread(conn, caller.tenant, thread_id)["id"]
            active = thread_store.active_run(conn, key)
            held = thread_store.next_held(conn, key)
            waited = segs.last_waiting_seq(conn, active["id"]) if active is not None else 0
        found = _Found(key, active, held is not None, waited)
        value = body.resume()
        checkpoint = body.checkpoint_ref()
        if checkpoint is not None and checkpoint != thread_id:
            return self._fork(caller, body, found, checkpoint, value)
        if value is not NO_RESUME:
            return self._resume(caller, body, found, value)
        return self._submit(caller, body, found)

    def _fork(
        self, caller: Caller, body: RunBody, found: _Found, checkpoint: str, value: Any
    ) -> segs.Leg:
        """A run from an earlier checkpoint of the thread (time travel): a fork of the run
        that checkpoint belongs to, at its round, continuing the thread with the new input
        or another answer to the interrupt it had (``command.resume``)."""
        thread_id = found.key
        run_id, _, seq_text = checkpoint.rpartition(":")
        with reading(self.rt.engine) as conn:
            source = run_store.load_run(conn, run_id, caller.tenant) if seq_text.isdigit() else None
            if source is None or source.thread_id != thread_id:
                raise NotFound(f"checkpoint {checkpoint} not found on thread {thread_id}")
            round_ = round_at(conn, run_id, int(seq_text))
            pending = _pause_at(conn, run_id, int(seq_text))
        msgs = input_messages(_input_list(body.input)) if body.input is not None else []
        answers = None
        if value is not NO_RESUME:
            decided = decode_resume(pending or {}, value) if pending else None
            if not isinstance(decided, Answer):
                raise Conflict(f"checkpoint {checkpoint} has no question to answer")
            answers = decided.answers
        agent = resolve(body.assistant_id, store_lookup(self.rt, caller.tenant))
        admit(self.rt, caller, agent.policed, agent.spec, msgs)
        self._make_room(caller.tenant, found, body)
        req = lifecycle.ForkInput(
            round=round_,
            input=msgs or None,
            answers=answers,
            thread_id=thread_id,
            metadata=body.metadata,
        )
        row = lifecycle.fork_run(
            self.rt, lifecycle.Actor(caller.tenant, caller.key_id), run_id, req
        )
        return self._segment(caller.tenant, row["id"], 0, body)

    def _resume(self, caller: Caller, body: RunBody, found: _Found, value: Any) -> segs.Leg:
        tenant, active = caller.tenant, found.active
        if body.input is not None:
            raise SpecError("send either input or command.resume, not both")
        if active is None or active["status"] != "waiting" or not active["pending"]:
            raise Conflict("the thread has no pending interrupt to resume")
        pending = active["pending"]
        decided = decode_resume(pending, value)
        if isinstance(decided, Answer):
            commands.answer_run(self.rt, tenant, active["id"], pause_id(pending), decided.answers)
        else:
            lists = decided.decisions is None
            commands.approve_run(
                self.rt,
                tenant,
                active["id"],
                pause_id(pending),
                decided.approve if lists else None,
                decided.reject if lists else None,
                decided.note,
                decisions=decided.decisions,
                by=caller.key_id or tenant,
            )
        return self._segment(tenant, active["id"], found.waited, body)

    def _submit(self, caller: Caller, body: RunBody, found: _Found) -> segs.Leg:
        tenant, thread_id = caller.tenant, found.key
        agent = resolve(body.assistant_id, store_lookup(self.rt, tenant))
        msgs = input_messages(_input_list(body.input))
        admit(self.rt, caller, agent.policed, agent.spec, msgs)
        hook = facade_webhook(PROTOCOL, self.rt.settings, tenant, body.assistant_id, body.webhook)
        if thread_id is None:
            thread_id = str(self.create_thread(tenant, ThreadBody())["id"])
        self._make_room(tenant, found, body)
        row = submit_facade_run(self.rt, agent, msgs, tenant, thread_id, body.metadata, hook)
        return self._segment(tenant, row["id"], 0, body)

    def _make_room(self, tenant: str, found: _Found, body: RunBody) -> None:
        """multitask_strategy on a busy or interrupted thread (docs/api.md)."""
        active, strategy = found.active, body.multitask_strategy or "enqueue"
        if active is None and not found.queued:
            return
        waiting = active is not None and active["status"] == "waiting"
        if strategy == "reject" or (waiting and strategy == "enqueue"):
            what = "interrupted (resume it with command.resume)" if waiting else "busy"
            raise Conflict(f"thread {found.key} is {what}")
        if strategy in ("interrupt", "rollback") and active is not None:
            with contextlib.suppress(Conflict):  # it ended meanwhile
                commands.cancel_run(self.rt, tenant, active["id"])

    def _segment(self, tenant: str, run_id: str, from_seq: int, body: RunBody) -> segs.Leg:
        options = {
            "stream_mode": modes_of(body.stream_mode),
            "multitask_strategy": body.multitask_strategy or "enqueue",
            "on_disconnect": body.on_disconnect,
            "webhook": body.webhook,
            "kwargs": {"config": body.config or {}},
        }
        with self.rt.engine.begin() as conn:
            return segs.open_leg(
                conn, PROTOCOL, tenant, run_id, from_seq, body.assistant_id, body.metadata, options
            )

    def cancel(self, tenant: str, leg: segs.Leg) -> None:
        if leg.closed:
            raise Conflict(
                f"run {leg.segment['id']} is {lg_run_status(leg.run, leg.end)}; "
                "only a pending or running run can be cancelled"
            )
        with contextlib.suppress(Conflict):  # ended meanwhile: cancel is idempotent
            commands.cancel_run(self.rt, tenant, leg.run["id"])

    def final(self, leg: segs.Leg) -> dict[str, Any]:
        with reading(self.rt.engine) as conn:
            return final_values(conn, segs.load_leg(conn, leg.segment))

    def state_rows(
        self, leg: segs.Leg, cursor: int
    ) -> tuple[list[Mapping[Any, Any]], float | None]:
        """The thread's messages, and the time of the event at ``cursor`` (None: the start)."""
        with reading(self.rt.engine) as conn:
            rows = segs.thread_rows(conn, leg.run)
            if cursor <= 0:
                return rows, None
            ev = records.list_events(conn, leg.run["id"], cursor - 1, limit=1)
            return rows, (ev[0]["created_at"] if ev else None)

    def rows(self, run: Mapping[Any, Any]) -> list[Mapping[Any, Any]]:
        with reading(self.rt.engine) as conn:
            return segs.thread_rows(conn, run)


def _pause_at(conn: Connection, run_id: str, seq: int) -> dict[str, Any] | None:
    """The pause a checkpoint (the seq of a ``run.waiting``) stood at, if it is one."""
    rows = records.list_events(conn, run_id, seq - 1, limit=1)
    if rows and rows[0]["seq"] == seq and rows[0]["type"] == EventType.RUN_WAITING:
        return dict((rows[0]["data"] or {}).get("pending") or {})
    return None


def _input_list(value: LgInput | None) -> list[Any]:
    if value is None:
        raise SpecError("input.messages: a list of messages is required (or command.resume)")
    return [m if isinstance(m, str) else m.model_dump(exclude_none=True) for m in value.messages]


def _facade(rt: RuntimeDep) -> _Facade:
    return _Facade(rt)


Facade = Annotated[_Facade, Depends(_facade)]
"""A route's LangGraph facade, over the request's runtime."""
