"""LangGraph Server routes over treadle (docs/api.md), mounted at ``/langgraph``:
what ``langgraph-sdk`` 0.4 speaks. A registered agent's name is the ``assistant_id``; a thread
is a treadle thread; each LangGraph run is a segment of a treadle run (``segments``).

``Location`` and ``Content-Location`` are relative to the SDK's base URL (no mount prefix).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Body, Depends, Header, Query, Response
from fastapi.responses import StreamingResponse
from sqlalchemy.engine import Connection
from starlette.concurrency import run_in_threadpool

from scheduler.http.agents import resolve, store_lookup
from scheduler.http.auth import Caller, ReadCaller, WriteCaller
from scheduler.http.deps import RuntimeDep
from scheduler.http.fleet import searchable
from scheduler.http.sse import SSE_HEADERS
from scheduler.http.tail import Batch, Beat, Delta, follow, wait_for_end
from scheduler.interop import lg_assistants, lg_crons
from scheduler.interop.common import admit, facade_webhook, stream_responses, submit_facade_run
from scheduler.interop.lg_bodies import (
    NO_RESUME,
    HistoryBody,
    LgInput,
    RunBody,
    SearchBody,
    ThreadBody,
)
from scheduler.interop.lg_stream import LgStream, modes_of
from shared.engine import commands, lifecycle
from shared.engine import threads as thread_engine
from shared.engine.runtime import Runtime
from shared.errors import Conflict, NotFound, SpecError
from shared.interop.shapes import (
    Answer,
    decode_resume,
    input_messages,
    interrupt_of,
    lc_messages,
    lg_run_status,
    lg_thread_status,
    pause_id,
)
from shared.interop.thread_ids import public_id, scoped_id
from shared.isotime import iso
from shared.store import records
from shared.store import runs as run_store
from shared.store import segments as segs
from shared.store import threads as thread_store
from shared.vocab import SEGMENT_ENDS, EventType

__all__ = ["Facade", "router"]

PROTOCOL = segs.LANGGRAPH


# --- views -----------------------------------------------------------------------------


def _run_view(leg: segs.Leg) -> dict[str, Any]:
    seg, opts = leg.segment, leg.segment["options"] or {}
    return {
        "run_id": seg["id"],
        "thread_id": public_id(seg["thread_id"]),
        "assistant_id": seg["assistant_id"],
        "created_at": iso(seg["created_at"]),
        "updated_at": iso(seg["updated_at"]),
        "status": lg_run_status(leg.run, leg.end),
        "metadata": seg["meta"] or {},
        "kwargs": opts.get("kwargs") or {},
        "multitask_strategy": opts.get("multitask_strategy") or "enqueue",
    }


def _thread_values(conn: Connection, latest: Mapping[Any, Any] | None) -> dict[str, Any]:
    rows = segs.thread_rows(conn, latest) if latest is not None else []
    return {"messages": lc_messages(rows)}


def _pending_interrupt(latest: Mapping[Any, Any] | None) -> dict[str, Any] | None:
    if latest is None or latest["status"] != "waiting" or not latest["pending"]:
        return None
    if latest["pending"].get("kind") == "provider":  # waiting out an outage: no interrupt
        return None
    return interrupt_of(latest["pending"])


def _thread_view(conn: Connection, thread: Mapping[Any, Any]) -> dict[str, Any]:
    latest = segs.latest_run(conn, thread["id"])
    interrupt = _pending_interrupt(latest)
    return {
        "thread_id": public_id(thread["id"]),
        "created_at": iso(thread["created_at"]),
        "updated_at": iso(thread["updated_at"]),
        "metadata": thread["meta"] or {},
        "status": lg_thread_status(latest),
        "values": _thread_values(conn, latest),
        "interrupts": {interrupt["id"]: [interrupt]} if interrupt else {},
        "config": {},
        "error": None,
    }


def _state(
    thread_id: str,
    values: dict[str, Any],
    run: Mapping[Any, Any] | None,
    seq: int,
    interrupt: dict[str, Any] | None,
) -> dict[str, Any]:
    node = (
        "ask_user"
        if (interrupt or {}).get("value", {}).get("treadle", {}).get("kind") == "ask"
        else "tools"
    )
    tasks = (
        [
            {
                "id": interrupt["id"],
                "name": node,
                "path": [],
                "error": None,
                "interrupts": [interrupt],
                "checkpoint": None,
                "state": None,
                "result": None,
            }
        ]
        if interrupt
        else []
    )
    checkpoint = {
        "thread_id": public_id(thread_id),
        "checkpoint_ns": "",
        "checkpoint_id": f"{run['id']}:{seq}" if run is not None else public_id(thread_id),
    }
    return {
        "values": values,
        "next": [node] if interrupt else [],
        "tasks": tasks,
        "checkpoint": checkpoint,
        "metadata": {},
        "parent_checkpoint": _fork_parent(thread_id, run),
        "created_at": iso(run["updated_at"]) if run is not None else None,
        "interrupts": [interrupt] if interrupt else [],
    }


def _fork_parent(thread_id: str, run: Mapping[Any, Any] | None) -> dict[str, Any] | None:
    """A run that started from a checkpoint (a fork) has it as its parent checkpoint."""
    if run is None or run.get("base_kind") != "fork" or not run.get("fork_point"):
        return None
    return {
        "thread_id": public_id(thread_id),
        "checkpoint_ns": "",
        "checkpoint_id": run["fork_point"],
    }


def _with_fork_point(conn: Connection, run: Mapping[Any, Any] | None) -> Any:
    """The run, with ``fork_point``: the checkpoint id a fork started from."""
    if run is None or run.get("base_kind") != "fork":
        return run
    seq = checkpoint_seq(conn, str(run["base_run_id"]), int(run["fork_round"] or 0))
    return {**run, "fork_point": f"{run['base_run_id']}:{seq}"}


def checkpoint_seq(conn: Connection, run_id: str, round_: int) -> int:
    """The event seq of the checkpoint that ends round N: its pause or end event (what the
    facade names checkpoints by), else the last event before the next round started."""
    current, found, before_next = 0, 0, 0
    for ev in records.list_events_of(conn, run_id, (EventType.ROUND_STARTED, *SEGMENT_ENDS)):
        if ev["type"] == EventType.ROUND_STARTED:
            current = int((ev["data"] or {}).get("round") or 0)
            if current > round_:
                before_next = before_next or int(ev["seq"]) - 1
        elif current == round_:
            found = int(ev["seq"])
    if found or before_next:
        return found or before_next
    latest = run_store.load_run(conn, run_id)
    return latest.event_seq if latest is not None else 0


def round_at(conn: Connection, run_id: str, seq: int) -> int:
    """The round a checkpoint (an event seq) of the run is at: the last round started by it."""
    round_ = 0
    for ev in records.list_events_of(conn, run_id, (EventType.ROUND_STARTED,)):
        if int(ev["seq"]) > seq:
            break
        round_ = int((ev["data"] or {}).get("round") or 0)
    return round_


def _current_state(conn: Connection, thread_id: str) -> dict[str, Any]:
    latest = _with_fork_point(conn, segs.latest_run(conn, thread_id))
    seq = latest["event_seq"] if latest is not None else 0
    return _state(thread_id, _thread_values(conn, latest), latest, seq, _pending_interrupt(latest))


def _state_at_end(conn: Connection, leg: segs.Leg) -> dict[str, Any] | None:
    if leg.end is None:
        return None
    rows = segs.thread_rows(conn, leg.run)
    values = {"messages": lc_messages(rows, leg.run["id"], upto=leg.end["created_at"])}
    pending = (
        (leg.end["data"] or {}).get("pending") if leg.end["type"] == EventType.RUN_WAITING else None
    )
    return _state(
        leg.segment["thread_id"],
        values,
        _with_fork_point(conn, leg.run),
        int(leg.end["seq"]),
        interrupt_of(pending) if pending else None,
    )


def _final_values(conn: Connection, leg: segs.Leg) -> dict[str, Any]:
    """What join and wait return: the values as the segment ended, with its interrupt or
    error (``__interrupt__``, ``__error__``)."""
    end = leg.end
    rows = segs.thread_rows(conn, leg.run)
    values: dict[str, Any] = {
        "messages": lc_messages(
            rows, leg.run["id"], upto=end["created_at"] if end is not None else None
        )
    }
    data = dict(end["data"] or {}) if end is not None else {}
    if end is not None and end["type"] == EventType.RUN_WAITING:
        values["__interrupt__"] = [interrupt_of(data.get("pending") or {})]
    if end is not None and end["type"] == EventType.RUN_FAILED:
        err = data.get("error") or {}
        values["__error__"] = {
            "error": str(err.get("code") or "Error"),
            "message": str(err.get("message") or "the run failed"),
        }
    return values


# --- commands ----------------------------------------------------------------------------


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
        with self.rt.engine.connect() as conn:
            seg = segs.get_segment(conn, run_id, tenant, PROTOCOL)
            if seg is None or public_id(seg["thread_id"] or "") != thread_id:
                raise NotFound(f"run {run_id} not found on thread {thread_id}")
            return segs.load_leg(conn, seg)

    def create_thread(self, tenant: str, body: ThreadBody) -> Mapping[Any, Any]:
        """A thread named by the client lives in the tenant's namespace (``scoped_id``):
        another tenant's thread of the same name is neither seen nor in the way."""
        thread_id = scoped_id(tenant, body.thread_id) if body.thread_id else str(uuid.uuid4())
        with self.rt.engine.connect() as conn:
            found = thread_store.get_thread(conn, thread_id, tenant)
        if found is not None:
            if body.if_exists == "do_nothing":
                return found
            raise Conflict(f"thread {body.thread_id} already exists")
        return thread_engine.create_thread(self.rt, tenant, body.metadata, "enqueue", thread_id)

    def start(self, caller: Caller, thread_id: str | None, body: RunBody) -> segs.Leg:
        """Create a LangGraph run: a resume of the thread's pause, or a new treadle run.
        ``thread_id`` None: a stateless run, on a new thread made only if it is admitted."""
        tenant = caller.tenant
        strategy = body.multitask_strategy or "enqueue"
        if thread_id is None:  # a stateless run: its thread is made once the run is admitted
            if body.resume() is not NO_RESUME:
                raise Conflict("the thread has no pending interrupt to resume")
            return self._submit(caller, None, body, None, False, strategy)
        with self.rt.engine.connect() as conn:
            key = self.thread(conn, tenant, thread_id)["id"]
            active = thread_store.active_run(conn, key)
            held = thread_store.next_held(conn, key)
            waited = segs.last_waiting_seq(conn, active["id"]) if active is not None else 0
        value = body.resume()
        checkpoint = body.checkpoint_ref()
        if checkpoint is not None and checkpoint != thread_id:
            busy = (active, held is not None, strategy)
            return self._fork(caller, key, body, checkpoint, value, busy)
        if value is not NO_RESUME:
            return self._resume(caller, body, active, waited, value)
        return self._submit(caller, key, body, active, held is not None, strategy)

    def _fork(
        self,
        caller: Caller,
        thread_id: str,
        body: RunBody,
        checkpoint: str,
        value: Any,
        busy: tuple[Mapping[Any, Any] | None, bool, str],
    ) -> segs.Leg:
        """A run from an earlier checkpoint of the thread (time travel): a fork of the run
        that checkpoint belongs to, at its round, continuing the thread with the new input
        or another answer to the interrupt it had (``command.resume``)."""
        run_id, _, seq_text = checkpoint.rpartition(":")
        with self.rt.engine.connect() as conn:
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
        self._make_room(caller.tenant, thread_id, *busy)
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

    def _resume(
        self,
        caller: Caller,
        body: RunBody,
        active: Mapping[Any, Any] | None,
        waited: int,
        value: Any,
    ) -> segs.Leg:
        tenant = caller.tenant
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
        return self._segment(tenant, active["id"], waited, body)

    def _submit(
        self,
        caller: Caller,
        thread_id: str | None,
        body: RunBody,
        active: Mapping[Any, Any] | None,
        queued: bool,
        strategy: str,
    ) -> segs.Leg:
        tenant = caller.tenant
        agent = resolve(body.assistant_id, store_lookup(self.rt, tenant))
        msgs = input_messages(_input_list(body.input))
        admit(self.rt, caller, agent.policed, agent.spec, msgs)
        hook = facade_webhook(PROTOCOL, self.rt.settings, tenant, body.assistant_id, body.webhook)
        if thread_id is None:
            thread_id = str(self.create_thread(tenant, ThreadBody())["id"])
        self._make_room(tenant, thread_id, active, queued, strategy)
        row = submit_facade_run(self.rt, agent, msgs, tenant, thread_id, body.metadata, hook)
        return self._segment(tenant, row["id"], 0, body)

    def _make_room(
        self,
        tenant: str,
        thread_id: str,
        active: Mapping[Any, Any] | None,
        queued: bool,
        strategy: str,
    ) -> None:
        """multitask_strategy on a busy or interrupted thread (docs/api.md)."""
        if active is None and not queued:
            return
        waiting = active is not None and active["status"] == "waiting"
        if strategy == "reject" or (waiting and strategy == "enqueue"):
            what = "interrupted (resume it with command.resume)" if waiting else "busy"
            raise Conflict(f"thread {thread_id} is {what}")
        if strategy in ("interrupt", "rollback") and active is not None:
            try:
                commands.cancel_run(self.rt, tenant, active["id"])
            except Conflict:
                pass  # it ended meanwhile

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
        try:
            commands.cancel_run(self.rt, tenant, leg.run["id"])
        except Conflict:
            pass  # ended meanwhile: cancel is idempotent

    def final(self, leg: segs.Leg) -> dict[str, Any]:
        with self.rt.engine.connect() as conn:
            return _final_values(conn, segs.load_leg(conn, leg.segment))

    def state_rows(
        self, leg: segs.Leg, cursor: int
    ) -> tuple[list[Mapping[Any, Any]], float | None]:
        """The thread's messages, and the time of the event at ``cursor`` (None: the start)."""
        with self.rt.engine.connect() as conn:
            rows = segs.thread_rows(conn, leg.run)
            if cursor <= 0:
                return rows, None
            ev = records.list_events(conn, leg.run["id"], cursor - 1, limit=1)
            return rows, (ev[0]["created_at"] if ev else None)

    def rows(self, run: Mapping[Any, Any]) -> list[Mapping[Any, Any]]:
        with self.rt.engine.connect() as conn:
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


def _event_id(value: str | None) -> int:
    text = (value or "").strip()
    return int(text) if text.isdigit() else 0


def _locations(leg: segs.Leg, suffix: str = "") -> dict[str, str]:
    base = f"/threads/{public_id(leg.segment['thread_id'])}/runs/{leg.segment['id']}"
    out = {"Content-Location": base}
    if suffix:
        out["Location"] = base + suffix
    return out


# --- streaming ---------------------------------------------------------------------------


async def _stream(
    f: _Facade, leg: segs.Leg, modes: list[str], cursor: int, cancel_on_drop: bool, tenant: str
) -> AsyncIterator[str]:
    """One segment as LangGraph SSE from ``cursor``; ends after the segment's end event."""
    cursor = max(cursor, int(leg.segment["from_seq"]))
    rows, at = await run_in_threadpool(f.state_rows, leg, cursor)
    start = cursor <= int(leg.segment["from_seq"])
    prev = None if start else lc_messages(rows, leg.run["id"], upto=at)
    out = LgStream(leg.segment["id"], leg.run["id"], modes, prev)
    finished = False
    try:
        yield out.metadata()
        if leg.end_seq is not None and cursor >= leg.end_seq:
            finished = True
            return
        async for item in follow(f.rt, leg.run["id"], cursor):
            if isinstance(item, Batch):
                rows = await run_in_threadpool(f.rows, leg.run)
                for ev in item.events:
                    yield out.durable(ev, rows)
                finished = item.last
            elif isinstance(item, Delta):
                yield out.delta(item.type, item.data)
            elif isinstance(item, Beat):
                yield ": heartbeat\n\n"
    finally:
        if cancel_on_drop and not finished:  # the client left (on_disconnect="cancel")
            with anyio.CancelScope(shield=True):
                await run_in_threadpool(_cancel_quietly, f, tenant, leg)


def _cancel_quietly(f: _Facade, tenant: str, leg: segs.Leg) -> None:
    try:
        commands.cancel_run(f.rt, tenant, leg.run["id"])
    except (Conflict, NotFound):
        pass


async def _join_body(f: _Facade, leg: segs.Leg) -> AsyncIterator[str]:
    """A newline every 5 s while the segment runs (the SDK reads for 300 s), then the values."""
    if not leg.closed:
        async for end in wait_for_end(f.rt, leg.run["id"], int(leg.segment["from_seq"])):
            if end is None:
                yield "\n"
    values = await run_in_threadpool(f.final, leg)
    yield json.dumps(values, ensure_ascii=False)


def _sse_response(body: AsyncIterator[str], headers: dict[str, str]) -> StreamingResponse:
    return StreamingResponse(
        body, media_type="text/event-stream", headers={**SSE_HEADERS, **headers}
    )


def _json_stream(
    body: AsyncIterator[str], headers: dict[str, str] | None = None
) -> StreamingResponse:
    return StreamingResponse(body, media_type="application/json", headers=headers or {})


# --- routes ------------------------------------------------------------------------------


def _facade(rt: RuntimeDep) -> _Facade:
    return _Facade(rt)


Facade = Annotated[_Facade, Depends(_facade)]
"""A route's LangGraph facade, over the request's runtime."""


_info = APIRouter()


@_info.get("/info")
def info() -> dict[str, Any]:
    return {
        "version": "treadle",
        "langgraph_py_version": None,
        "flags": {"assistants": True, "crons": True, "langsmith": False},
        "host": {"kind": "treadle"},
    }


_threads = APIRouter()


@_threads.post("/threads")
def create_thread(
    f: Facade, caller: WriteCaller, body: Annotated[ThreadBody | None, Body()] = None
) -> dict[str, Any]:
    row = f.create_thread(caller.tenant, body or ThreadBody())
    with f.rt.engine.connect() as conn:
        return _thread_view(conn, row)


@_threads.get("/threads/{thread_id}")
def get_thread(thread_id: str, f: Facade, caller: ReadCaller) -> dict[str, Any]:
    with f.rt.engine.connect() as conn:
        return _thread_view(conn, f.thread(conn, caller.tenant, thread_id))


@_threads.post("/threads/search")
def search_threads(
    f: Facade, caller: ReadCaller, body: Annotated[SearchBody | None, Body()] = None
) -> list[dict[str, Any]]:
    body = body or SearchBody()
    with f.rt.engine.connect() as conn:
        rows = _search(conn, caller.tenant, body)
        return [_thread_view(conn, t) for t in rows[body.offset : body.offset + body.limit]]


@_threads.get("/threads/{thread_id}/state")
def get_state(thread_id: str, f: Facade, caller: ReadCaller) -> dict[str, Any]:
    with f.rt.engine.connect() as conn:
        return _current_state(conn, f.thread(conn, caller.tenant, thread_id)["id"])


@_threads.post("/threads/{thread_id}/history")
def history(
    thread_id: str,
    f: Facade,
    caller: ReadCaller,
    body: Annotated[HistoryBody | None, Body()] = None,
) -> list[dict[str, Any]]:
    limit = (body or HistoryBody()).limit
    with f.rt.engine.connect() as conn:
        key = f.thread(conn, caller.tenant, thread_id)["id"]
        states = [_current_state(conn, key)]
        for seg in segs.thread_segments(conn, key, PROTOCOL, limit=limit):
            state = _state_at_end(conn, segs.load_leg(conn, seg))
            ids = {s["checkpoint"]["checkpoint_id"] for s in states}
            if state is not None and state["checkpoint"]["checkpoint_id"] not in ids:
                states.append(state)
    return states[:limit]


def _search(conn: Connection, tenant: str, body: SearchBody) -> list[Mapping[Any, Any]]:
    """The tenant's threads (newest first) whose metadata holds ``body.metadata``, in
    ``body.status``: the store selects by ids and string values (``search_threads``), the
    other values and the status are checked here."""
    want = body.metadata or {}
    strings = {k: v for k, v in want.items() if searchable(k, v)}
    ids = [*body.ids, *(scoped_id(tenant, i) for i in body.ids)] if body.ids else None
    rows: list[Mapping[Any, Any]] = [
        t
        for t in thread_store.search_threads(conn, tenant, ids=ids, metadata=strings)
        if all((t["meta"] or {}).get(k) == v for k, v in want.items())
    ]
    if body.status:
        rows = [t for t in rows if lg_thread_status(segs.latest_run(conn, t["id"])) == body.status]
    return rows


_runs = APIRouter()


@_runs.post("/threads/{thread_id}/runs")
def create_run(
    thread_id: str, body: RunBody, response: Response, f: Facade, caller: WriteCaller
) -> dict[str, Any]:
    leg = f.start(caller, thread_id, body)
    response.headers.update(_locations(leg))
    return _run_view(leg)


@_runs.post("/threads/{thread_id}/runs/stream", response_model=None, responses=stream_responses())
async def stream_run(
    thread_id: str, body: RunBody, f: Facade, caller: WriteCaller
) -> StreamingResponse:
    leg = await run_in_threadpool(f.start, caller, thread_id, body)
    modes = modes_of(body.stream_mode)
    gen = _stream(f, leg, modes, 0, body.on_disconnect == "cancel", caller.tenant)
    return _sse_response(gen, _locations(leg, "/stream"))


@_runs.post("/threads/{thread_id}/runs/wait", response_model=None)
async def wait_run(
    thread_id: str, body: RunBody, f: Facade, caller: WriteCaller
) -> StreamingResponse:
    leg = await run_in_threadpool(f.start, caller, thread_id, body)
    return _json_stream(_join_body(f, leg), _locations(leg, "/join"))


@_runs.get("/threads/{thread_id}/runs")
def list_runs(
    thread_id: str,
    f: Facade,
    caller: ReadCaller,
    limit: Annotated[int, Query(ge=1, le=1000)] = 10,
    offset: Annotated[int, Query(ge=0)] = 0,
    status: str | None = None,
) -> list[dict[str, Any]]:
    with f.rt.engine.connect() as conn:
        key = f.thread(conn, caller.tenant, thread_id)["id"]
        legs = [
            segs.load_leg(conn, s) for s in segs.thread_segments(conn, key, PROTOCOL, limit=1000)
        ]
    views = [_run_view(leg) for leg in legs]
    views = [v for v in views if not status or v["status"] == status]
    return views[offset : offset + limit]


@_runs.get("/threads/{thread_id}/runs/{run_id}")
def get_run(thread_id: str, run_id: str, f: Facade, caller: ReadCaller) -> dict[str, Any]:
    return _run_view(f.leg(caller.tenant, thread_id, run_id))


@_runs.get("/threads/{thread_id}/runs/{run_id}/join", response_model=None)
async def join_run(thread_id: str, run_id: str, f: Facade, caller: ReadCaller) -> StreamingResponse:
    leg = await run_in_threadpool(f.leg, caller.tenant, thread_id, run_id)
    return _json_stream(_join_body(f, leg))


@_runs.get(
    "/threads/{thread_id}/runs/{run_id}/stream",
    response_model=None,
    responses=stream_responses(),
)
async def join_stream(
    thread_id: str,
    run_id: str,
    f: Facade,
    caller: ReadCaller,
    stream_mode: Annotated[list[str] | None, Query()] = None,
    cancel_on_disconnect: bool = False,
    last_event_id: Annotated[str | None, Header()] = None,
) -> StreamingResponse:
    leg = await run_in_threadpool(f.leg, caller.tenant, thread_id, run_id)
    cursor = _event_id(last_event_id)
    modes = modes_of(stream_mode, (leg.segment["options"] or {}).get("stream_mode"))
    gen = _stream(f, leg, modes, cursor, cancel_on_disconnect, caller.tenant)
    return _sse_response(gen, _locations(leg, "/stream"))


@_runs.post("/threads/{thread_id}/runs/{run_id}/cancel", response_model=None)
async def cancel_run(
    thread_id: str,
    run_id: str,
    f: Facade,
    caller: WriteCaller,
    wait: bool = False,
    action: str = "interrupt",
) -> Response:
    leg = await run_in_threadpool(f.leg, caller.tenant, thread_id, run_id)
    await run_in_threadpool(f.cancel, caller.tenant, leg)
    if not wait:
        return Response(status_code=202)
    return _json_stream(_join_body(f, leg))


_stateless = APIRouter()
"""``/runs``, ``/runs/stream``, ``/runs/wait``: a run on a new thread of its own."""


@_stateless.post("/runs")
def create(body: RunBody, response: Response, f: Facade, caller: WriteCaller) -> dict[str, Any]:
    leg = f.start(caller, None, body)
    response.headers.update(_locations(leg))
    return _run_view(leg)


@_stateless.post("/runs/stream", response_model=None, responses=stream_responses())
async def stream(body: RunBody, f: Facade, caller: WriteCaller) -> StreamingResponse:
    leg = await run_in_threadpool(f.start, caller, None, body)
    gen = _stream(
        f, leg, modes_of(body.stream_mode), 0, body.on_disconnect == "cancel", caller.tenant
    )
    return _sse_response(gen, _locations(leg, "/stream"))


@_stateless.post("/runs/wait", response_model=None)
async def wait(body: RunBody, f: Facade, caller: WriteCaller) -> StreamingResponse:
    leg = await run_in_threadpool(f.start, caller, None, body)
    return _json_stream(_join_body(f, leg), _locations(leg, "/join"))


router = APIRouter(tags=["langgraph"])
"""The LangGraph Server routes; include with ``prefix="/langgraph"``."""
# in this order (the first matching route serves)
router.include_router(_info)
router.include_router(lg_assistants.router)
router.include_router(_threads)
router.include_router(_runs)
router.include_router(_stateless)
router.include_router(lg_crons.router)
