"""The LangGraph run routes: a run on a thread (``/threads/{id}/runs...``) or on a new thread
of its own (``/runs``, ``/runs/stream``, ``/runs/wait``); create, stream, wait, join, list and
cancel. ``Location`` and ``Content-Location`` are relative to the SDK's base URL (no mount
prefix)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

import anyio
from fastapi import Header, Query, Response
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from scheduler.http.auth import ReadCaller, WriteCaller
from scheduler.http.routing import api_router
from scheduler.http.sse import SSE_HEADERS
from scheduler.http.tail import Batch, Beat, Delta, follow, wait_for_end
from scheduler.interop.common import stream_responses
from scheduler.interop.langgraph.bodies import (
    RunBody,
)
from scheduler.interop.langgraph.facade import PROTOCOL, Facade
from scheduler.interop.langgraph.stream import LgStream, modes_of
from scheduler.interop.langgraph.views import run_view
from shared.engine import commands
from shared.errors import Conflict, NotFound
from shared.interop.shapes import (
    lc_messages,
)
from shared.interop.thread_ids import public_id
from shared.store import segments as segs
from shared.store.db import reading

__all__ = ["router"]


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
    f: Facade, leg: segs.Leg, modes: list[str], cursor: int, cancel_on_drop: bool, tenant: str
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


def _cancel_quietly(f: Facade, tenant: str, leg: segs.Leg) -> None:
    with contextlib.suppress(Conflict, NotFound):
        commands.cancel_run(f.rt, tenant, leg.run["id"])


async def _join_body(f: Facade, leg: segs.Leg) -> AsyncIterator[str]:
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


router = api_router()


@router.post("/threads/{thread_id}/runs")
def create_run(
    thread_id: str, body: RunBody, response: Response, f: Facade, caller: WriteCaller
) -> dict[str, Any]:
    leg = f.start(caller, thread_id, body)
    response.headers.update(_locations(leg))
    return run_view(leg)


@router.post("/threads/{thread_id}/runs/stream", response_model=None, responses=stream_responses())
async def stream_run(
    thread_id: str, body: RunBody, f: Facade, caller: WriteCaller
) -> StreamingResponse:
    leg = await run_in_threadpool(f.start, caller, thread_id, body)
    modes = modes_of(body.stream_mode)
    gen = _stream(f, leg, modes, 0, body.on_disconnect == "cancel", caller.tenant)
    return _sse_response(gen, _locations(leg, "/stream"))


@router.post("/threads/{thread_id}/runs/wait", response_model=None)
async def wait_run(
    thread_id: str, body: RunBody, f: Facade, caller: WriteCaller
) -> StreamingResponse:
    leg = await run_in_threadpool(f.start, caller, thread_id, body)
    return _json_stream(_join_body(f, leg), _locations(leg, "/join"))


@router.get("/threads/{thread_id}/runs")
def list_runs(
    thread_id: str,
    f: Facade,
    caller: ReadCaller,
    limit: Annotated[int, Query(ge=1, le=1000)] = 10,
    offset: Annotated[int, Query(ge=0)] = 0,
    status: str | None = None,
) -> list[dict[str, Any]]:
    with reading(f.rt.engine) as conn:
        key = f.thread(conn, caller.tenant, thread_id)["id"]
        legs = [
            segs.load_leg(conn, s) for s in segs.thread_segments(conn, key, PROTOCOL, limit=1000)
        ]
    views = [run_view(leg) for leg in legs]
    views = [v for v in views if not status or v["status"] == status]
    return views[offset : offset + limit]


@router.get("/threads/{thread_id}/runs/{run_id}")
def get_run(thread_id: str, run_id: str, f: Facade, caller: ReadCaller) -> dict[str, Any]:
    return run_view(f.leg(caller.tenant, thread_id, run_id))


@router.get("/threads/{thread_id}/runs/{run_id}/join", response_model=None)
async def join_run(thread_id: str, run_id: str, f: Facade, caller: ReadCaller) -> StreamingResponse:
    leg = await run_in_threadpool(f.leg, caller.tenant, thread_id, run_id)
    return _json_stream(_join_body(f, leg))


@router.get(
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


@router.post("/threads/{thread_id}/runs/{run_id}/cancel", response_model=None)
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


# ``/runs``, ``/runs/stream``, ``/runs/wait``: a run on a new thread of its own


@router.post("/runs")
def create(body: RunBody, response: Response, f: Facade, caller: WriteCaller) -> dict[str, Any]:
    leg = f.start(caller, None, body)
    response.headers.update(_locations(leg))
    return run_view(leg)


@router.post("/runs/stream", response_model=None, responses=stream_responses())
async def stream(body: RunBody, f: Facade, caller: WriteCaller) -> StreamingResponse:
    leg = await run_in_threadpool(f.start, caller, None, body)
    gen = _stream(
        f, leg, modes_of(body.stream_mode), 0, body.on_disconnect == "cancel", caller.tenant
    )
    return _sse_response(gen, _locations(leg, "/stream"))


@router.post("/runs/wait", response_model=None)
async def wait(body: RunBody, f: Facade, caller: WriteCaller) -> StreamingResponse:
    leg = await run_in_threadpool(f.start, caller, None, body)
    return _json_stream(_join_body(f, leg), _locations(leg, "/join"))
