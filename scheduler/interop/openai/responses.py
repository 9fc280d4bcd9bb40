"""OpenAI Responses background routes over treadle (docs/api.md), mounted at
``/openai/v1``: ``OpenAI(base_url=".../openai/v1")`` drives treadle with ``model`` = a
registered agent's name.

Each response is a segment of a treadle run. A pause completes it with a ``function_call``
named ``ask_user`` (answered by ``previous_response_id`` + ``function_call_output``) or with
``mcp_approval_request`` items (answered by ``mcp_approval_response`` items); tools treadle ran
itself are ``mcp_call`` items. A new input after a finished response continues its thread.
Errors use OpenAI's body; a conflict is 400 (the SDK retries 409).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import Depends, Query, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError
from sqlalchemy.engine import Connection
from starlette.concurrency import run_in_threadpool

from scheduler.http.agents import resolve, store_lookup
from scheduler.http.auth import Caller, ReadCaller, WriteCaller
from scheduler.http.deps import RuntimeDep
from scheduler.http.errors import client_path
from scheduler.http.routing import api_router
from scheduler.http.sse import SSE_HEADERS
from scheduler.http.tail import Batch, Beat, Delta, follow, wait_for_end
from scheduler.interop.common import admit, facade_webhook, stream_responses, submit_facade_run
from scheduler.interop.openai.bodies import CREATE_REQUEST, RESUME_TYPES, CreateBody
from scheduler.interop.openai.stream import Facts, ResponseFold, Start, StreamEvent
from shared.agent.approval import ItemDecision
from shared.engine import commands
from shared.engine import threads as thread_engine
from shared.engine.runtime import Runtime
from shared.errors import Conflict, NotFound, SpecError, TreadleError, Unauthorized
from shared.interop.shapes import (
    Approve,
    approval_of,
    decision,
    input_messages,
    oa_status,
    pause_id,
)
from shared.store import records
from shared.store import runs as run_store
from shared.store import segments as segs
from shared.store.db import reading
from shared.vocab import EventType

__all__ = ["Facade", "router"]

PROTOCOL = segs.OPENAI


# --- errors ------------------------------------------------------------------------------


def _error(exc: Exception, sent: Any = None) -> JSONResponse:
    """OpenAI's error body. A conflict is 400: the SDK retries 409s. An invalid field is named
    as sent (``sent``: the parsed body), in the message and in ``param``."""
    status, code = 400, "invalid_request_error"
    if isinstance(exc, NotFound):
        status, code = 404, "not_found"
    elif isinstance(exc, Unauthorized):
        status, code = 401, "invalid_api_key"
    elif isinstance(exc, Conflict):
        code = "conflict"
    message, param = str(exc), None
    if isinstance(exc, ValidationError) and exc.errors():
        first = exc.errors()[0]
        param = client_path(first["loc"], sent, missing=first["type"] == "missing") or None
        message = f"{param}: {first['msg']}" if param else first["msg"]
    body = {
        "error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}
    }
    return JSONResponse(body, status_code=status)


FACADE_ERRORS = (TreadleError, ValidationError, ValueError)


# --- input items -------------------------------------------------------------------------


def _is_resume(items: list[dict[str, Any]]) -> bool:
    return any(it.get("type") in RESUME_TYPES for it in items)


def _messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if _is_resume(items):
        raise SpecError(
            "function_call_output and mcp_approval_response items answer a "
            "paused response: send them with its previous_response_id"
        )
    wanted = [it for it in items if it.get("type", "message") == "message"]
    return input_messages(wanted, "input")


def _answers(output: Any) -> list[str]:
    """A ``function_call_output``: ``{"answers": [...]}``, a list, or a plain string."""
    text = output if isinstance(output, str) else json.dumps(output)
    try:
        value = json.loads(text)
    except ValueError:
        return [text]
    if isinstance(value, dict) and isinstance(value.get("answers"), list):
        value = value["answers"]
    if isinstance(value, list):
        return [v if isinstance(v, str) else json.dumps(v) for v in value]
    return [value if isinstance(value, str) else text]


def _approval(pending: dict[str, Any], items: list[dict[str, Any]]) -> Approve:
    """One ``mcp_approval_response`` per pending item: ``approve`` runs it (with
    ``arguments``, a treadle extension: the edited arguments, an object or its JSON text);
    ``approve: false`` declines it and its ``reason`` is what the model reads."""
    pend = {str(it["call_id"]): it for it in pending.get("items") or []}
    said: dict[str, Any] = {}
    for it in items:
        if it.get("type") != "mcp_approval_response":
            continue
        call_id = str(it.get("approval_request_id") or "").removeprefix("mcpr_")
        if call_id not in pend:
            raise SpecError(f"no approval request {it.get('approval_request_id')!r} is pending")
        said[call_id] = _item_decision(pend[call_id], it)
    missing = [f"mcpr_{i}" for i in pend if i not in said]
    if missing:
        raise SpecError(f"every approval request needs a response; missing {', '.join(missing)}")
    return approval_of([said[i] for i in pend])


def _item_decision(item: dict[str, Any], response: dict[str, Any]) -> ItemDecision:
    edited = response.get("arguments")
    if not response.get("approve"):
        if edited is not None:
            raise SpecError("arguments belong to an approved mcp_approval_response")
        return decision(item, "reject", message=response.get("reason"))
    if edited is None:
        return decision(item, "approve")
    if isinstance(edited, str):
        try:
            edited = json.loads(edited)
        except ValueError:
            raise SpecError(f"the arguments for {item['tool']} are not JSON") from None
    if not isinstance(edited, dict):
        raise SpecError(f"the arguments for {item['tool']} must be a JSON object")
    return decision(item, "edit", arguments=edited)


# --- the facade --------------------------------------------------------------------------


class _Facade:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def leg(self, tenant: str, response_id: str) -> segs.Leg:
        with reading(self.rt.engine) as conn:
            seg = segs.get_segment(conn, response_id, tenant, PROTOCOL)
            if seg is None:
                raise NotFound(f"response {response_id} not found")
            return segs.load_leg(conn, seg)

    def create(self, caller: Caller, body: CreateBody, key: str | None = None) -> segs.Leg:
        """A new response: a resume of a paused one, a follow-up on its thread, or a new
        conversation. ``key``: an ``Idempotency-Key`` (a retried create finds its run)."""
        tenant = caller.tenant
        items = body.items()  # the body's own rules are checked by its model (oa_bodies)
        if body.previous_response_id:
            prev = self.leg(tenant, body.previous_response_id)
            if _paused(prev):
                return self._resume(caller, body, prev, items)
            return self._follow_up(caller, body, prev, items)
        replayed = self._replayed(tenant, key)
        if replayed is not None:
            return self._segment(tenant, replayed, 0, body, items)
        return self._submit(caller, body, None, items, key)

    def _replayed(self, tenant: str, key: str | None) -> str | None:
        if not key:
            return None
        if len(key) > 200:
            raise SpecError("Idempotency-Key: at most 200 characters")
        with reading(self.rt.engine) as conn:
            found = run_store.find_idempotent(conn, tenant, key)
        return str(found["id"]) if found is not None else None

    def _follow_up(
        self, caller: Caller, body: CreateBody, prev: segs.Leg, items: list[dict[str, Any]]
    ) -> segs.Leg:
        if _is_resume(items):
            raise Conflict(
                f"response {prev.segment['id']} is not waiting for tool output or approvals"
            )
        if not prev.closed or prev.run["status"] in ("queued", "running"):
            raise Conflict(f"response {prev.segment['id']} is still in progress")
        if prev.run["thread_id"] is None:
            raise SpecError(f"response {prev.segment['id']} cannot be continued")
        return self._submit(caller, body, prev.run["thread_id"], items)

    def _submit(
        self,
        caller: Caller,
        body: CreateBody,
        thread_id: str | None,
        items: list[dict[str, Any]],
        key: str | None = None,
    ) -> segs.Leg:
        """``thread_id`` None: a new conversation, whose thread is made once it is admitted."""
        tenant = caller.tenant
        agent = resolve(body.model, store_lookup(self.rt, tenant))
        msgs = _messages(items)
        admit(self.rt, caller, agent.policed, agent.spec, msgs)
        if thread_id is None:
            thread_id = f"thr_{uuid.uuid4().hex[:24]}"
            thread_engine.create_thread(self.rt, tenant, None, "reject", thread_id)
        hook = facade_webhook(PROTOCOL, self.rt.settings, tenant, body.model)
        row = submit_facade_run(self.rt, agent, msgs, tenant, thread_id, body.metadata, hook, key)
        return self._segment(tenant, row["id"], 0, body, items)

    def _resume(
        self, caller: Caller, body: CreateBody, prev: segs.Leg, items: list[dict[str, Any]]
    ) -> segs.Leg:
        tenant = caller.tenant
        pending, run_id = dict(prev.run["pending"] or {}), prev.run["id"]
        if pending.get("kind") == "ask":
            ask_id = str(pending["ask_id"])
            out = next(
                (
                    it
                    for it in items
                    if it.get("type") == "function_call_output" and it.get("call_id") == ask_id
                ),
                None,
            )
            if out is None:
                raise SpecError(
                    f"response {prev.segment['id']} waits for a "
                    f"function_call_output for call {ask_id} (ask_user)"
                )
            commands.answer_run(self.rt, tenant, run_id, ask_id, _answers(out.get("output")))
        else:
            decided = _approval(pending, items)
            commands.approve_run(
                self.rt,
                tenant,
                run_id,
                str(pending["approval_id"]),
                decisions=decided.decisions,
                by=caller.key_id or tenant,
            )
        return self._segment(tenant, run_id, int(prev.end_seq or 0), body, items)

    def _segment(
        self, tenant: str, run_id: str, from_seq: int, body: CreateBody, items: list[dict[str, Any]]
    ) -> segs.Leg:
        options = {
            "background": bool(body.background),
            "stream": bool(body.stream),
            "previous_response_id": body.previous_response_id,
            "input": items,
        }
        with self.rt.engine.begin() as conn:
            return segs.open_leg(
                conn, PROTOCOL, tenant, run_id, from_seq, body.model, body.metadata, options
            )

    def cancel(self, tenant: str, leg: segs.Leg) -> segs.Leg:
        if leg.closed and oa_status(leg.run, leg.end) != "cancelled":
            raise Conflict(
                f"response {leg.segment['id']} is {oa_status(leg.run, leg.end)}; "
                "only a queued or in-progress response can be cancelled"
            )
        if not leg.closed:
            try:
                commands.cancel_run(self.rt, tenant, leg.run["id"])
            except Conflict:
                pass  # it ended meanwhile
        return self.leg(tenant, leg.segment["id"])

    def fold(self, leg: segs.Leg) -> ResponseFold:
        return ResponseFold(_start(self.rt, leg))

    def snapshot(self, leg: segs.Leg) -> dict[str, Any]:
        """The Response object: the fold of the segment's durable events so far."""
        fold = self.fold(leg)
        with reading(self.rt.engine) as conn:  # one connection: SQLite locks on each
            leg = segs.load_leg(conn, leg.segment)
            facts = _facts(conn, leg.run["id"])
            fold.begin(facts.rows)
            for ev in _segment_events(conn, leg):
                fold.durable(ev, facts)
        if leg.end is None:
            fold.status = oa_status(leg.run, None)
        return fold.response()

    def expand(
        self, fold: ResponseFold, leg: segs.Leg, events: list[dict[str, Any]]
    ) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        with reading(self.rt.engine) as conn:
            facts = _facts(conn, leg.run["id"])
            for ev in events:
                out += fold.durable(ev, facts)
        return out

    def begin(self, fold: ResponseFold, leg: segs.Leg) -> list[StreamEvent]:
        with reading(self.rt.engine) as conn:
            return fold.begin(_facts(conn, leg.run["id"]).rows)


def _paused(leg: segs.Leg) -> bool:
    """Is this response the pause its run still waits on?"""
    end = leg.end
    if end is None or end["type"] != EventType.RUN_WAITING or leg.run["status"] != "waiting":
        return False
    pending = (end["data"] or {}).get("pending") or {}
    return bool(leg.run["pending"]) and pause_id(pending) == pause_id(leg.run["pending"])


def _start(rt: Runtime, leg: segs.Leg) -> Start:
    seg, opts = leg.segment, leg.segment["options"] or {}
    start_ts = None
    if seg["from_seq"]:
        with reading(rt.engine) as conn:
            ev = records.list_events(conn, seg["run_id"], int(seg["from_seq"]) - 1, limit=1)
        start_ts = float(ev[0]["created_at"]) if ev else None
    return Start(
        response_id=seg["id"],
        run_id=seg["run_id"],
        model=seg["assistant_id"],
        created_at=float(seg["created_at"]),
        from_seq=int(seg["from_seq"]),
        start_ts=start_ts,
        previous_response_id=opts.get("previous_response_id"),
        metadata=dict(seg["meta"] or {}),
        background=bool(opts.get("background")),
    )


def _facts(conn: Connection, run_id: str) -> Facts:
    def usage(rounds: set[int]) -> dict[str, int]:
        return segs.usage_of(conn, run_id, rounds)

    return Facts(records.list_messages(conn, run_id), segs.tool_rows(conn, run_id), usage)


def _segment_events(conn: Connection, leg: segs.Leg) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    after = int(leg.segment["from_seq"])
    while True:
        batch = [dict(e) for e in records.list_events(conn, leg.run["id"], after, limit=1000)]
        for ev in batch:
            out.append(ev)
            if leg.end_seq is not None and ev["seq"] >= leg.end_seq:
                return out
        if len(batch) < 1000:
            return out
        after = batch[-1]["seq"]


# --- streaming ---------------------------------------------------------------------------


def _sse(events: list[StreamEvent], after: int | None) -> str:
    return "".join(
        f"event: {p['type']}\ndata: {json.dumps(p, ensure_ascii=False)}\n\n"
        for num, p in events
        if after is None or num > after
    )


async def _stream(f: _Facade, leg: segs.Leg, after: int | None) -> AsyncIterator[str]:
    """The response's events from its start, those numbered above ``after`` sent; ends after
    the completing (or failing) event, or at a cancel."""
    fold = await run_in_threadpool(f.fold, leg)
    yield _sse(await run_in_threadpool(f.begin, fold, leg), after)
    async for item in follow(f.rt, leg.run["id"], int(leg.segment["from_seq"])):
        if isinstance(item, Batch):
            yield _sse(await run_in_threadpool(f.expand, fold, leg, item.events), after)
        elif isinstance(item, Delta):
            yield _sse(fold.delta(item.type, item.data), after)
        elif isinstance(item, Beat):
            yield ": keep-alive\n\n"


def _sse_response(body: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(body, media_type="text/event-stream", headers=SSE_HEADERS)


async def _finished(f: _Facade, leg: segs.Leg) -> dict[str, Any]:
    if not leg.closed:
        async for _ in wait_for_end(f.rt, leg.run["id"], int(leg.segment["from_seq"])):
            pass
    return await run_in_threadpool(f.snapshot, leg)


def _input_item(item: dict[str, Any], n: int, response_id: str) -> dict[str, Any]:
    if item.get("type", "message") != "message":
        return {"id": f"in_{response_id}_{n}", **item}
    content = item.get("content", "")
    parts = [{"type": "input_text", "text": content}] if isinstance(content, str) else content
    return {
        "type": "message",
        "id": f"in_{response_id}_{n}",
        "role": item.get("role", "user"),
        "status": "completed",
        "content": parts,
    }


# --- routes ------------------------------------------------------------------------------


def _facade(rt: RuntimeDep) -> _Facade:
    return _Facade(rt)


Facade = Annotated[_Facade, Depends(_facade)]
"""A route's Responses facade, over the request's runtime."""

router = api_router(tags=["openai"])
"""The Responses routes; include with ``prefix="/openai/v1"``."""


@router.post(
    "/responses",
    response_model=None,
    openapi_extra=CREATE_REQUEST,
    responses=stream_responses(json=True),
)
async def create(request: Request, f: Facade, caller: WriteCaller) -> Response:
    sent: Any = None
    try:
        sent = await request.json()
        body = CreateBody.model_validate(sent)
        key = request.headers.get("idempotency-key") or None
        leg = await run_in_threadpool(f.create, caller, body, key)
    except FACADE_ERRORS as exc:
        return _error(exc, sent)
    if body.stream:
        return _sse_response(_stream(f, leg, None))
    if body.background:
        return JSONResponse(await run_in_threadpool(f.snapshot, leg))
    return JSONResponse(await _finished(f, leg))


@router.get("/responses/{response_id}", response_model=None)
async def retrieve(
    response_id: str,
    f: Facade,
    caller: ReadCaller,
    stream: bool = False,
    starting_after: Annotated[int | None, Query()] = None,
) -> Response:
    try:
        leg = await run_in_threadpool(f.leg, caller.tenant, response_id)
    except FACADE_ERRORS as exc:
        return _error(exc)
    if stream:
        return _sse_response(_stream(f, leg, starting_after))
    return JSONResponse(await run_in_threadpool(f.snapshot, leg))


@router.post("/responses/{response_id}/cancel", response_model=None)
def cancel(response_id: str, f: Facade, caller: WriteCaller) -> Response:
    try:
        leg = f.cancel(caller.tenant, f.leg(caller.tenant, response_id))
    except FACADE_ERRORS as exc:
        return _error(exc)
    return JSONResponse(f.snapshot(leg))


@router.get("/responses/{response_id}/input_items", response_model=None)
def input_items(response_id: str, f: Facade, caller: ReadCaller) -> Response:
    try:
        leg = f.leg(caller.tenant, response_id)
    except FACADE_ERRORS as exc:
        return _error(exc)
    raw = list((leg.segment["options"] or {}).get("input") or [])
    data = [_input_item(it, i, response_id) for i, it in enumerate(raw)]
    return JSONResponse(
        {
            "object": "list",
            "data": data,
            "has_more": False,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
        }
    )
