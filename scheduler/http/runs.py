"""The runs routes (docs/api.md): submit, list, read, cancel, answer, approve, webhook
deliveries and the SSE event stream."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Annotated, Any, TypeVar

from fastapi import Body, Header, Query, Request, Response
from fastapi.responses import StreamingResponse

from scheduler.http import limits
from scheduler.http.agents import AGENT_NAME, Resolved, resolve, store_lookup
from scheduler.http.auth import Caller, ReadCaller, ResumeCaller, WriteCaller
from scheduler.http.deliveries import DeliveryList, DeliveryView, delivery_view
from scheduler.http.deps import RuntimeDep
from scheduler.http.fleet import IsoTime, query_filter
from scheduler.http.routing import api_router
from scheduler.http.schemas import (
    CURSOR_PATTERN,
    AnswerBody,
    ApprovalBody,
    ListBody,
    MessageList,
    PathId,
    RunCreate,
    RunList,
    RunStatus,
    RunView,
    ToolCallList,
    message_view,
    run_view,
    tool_call_view,
)
from scheduler.http.sse import SSE_HEADERS, event_stream
from shared.engine import commands
from shared.engine.runtime import Runtime
from shared.errors import NotFound, SpecError
from shared.store import calls as call_store
from shared.store import deliveries, records
from shared.store import runs as run_store
from shared.store.db import reading

__all__ = ["router"]

RunId = PathId
_SSE_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "The event stream", "content": {"text/event-stream": {}}},
    204: {"description": "The run is over and the client has seen its last event"},
}


def _cursor(row: Any) -> str:
    return f"{row['created_at']!r}:{row['id']}"


def _parse_cursor(cursor: str | None) -> tuple[float, str] | None:
    if not cursor:
        return None
    try:
        ts, rid = cursor.split(":", 1)
        return float(ts), rid
    except ValueError as exc:
        raise SpecError("invalid cursor") from exc


_Given = tuple[str | list[dict[str, Any]], dict[str, Any]]
"""A submission's input and its other inputs (quotes, attachments)."""


def _submit_input(body: RunCreate) -> _Given:
    inp: str | list[dict[str, Any]] = (
        body.input if isinstance(body.input, str) else [m.model_dump() for m in body.input]
    )
    inputs: dict[str, Any] = {}
    if body.quotes:
        inputs["quotes"] = [q.model_dump(exclude_none=True) for q in body.quotes]
    if body.attachments:
        inputs["attachments"] = body.attachments
    if body.quotes_from:
        inputs["quotes_from"] = body.quotes_from.model_dump()
    return inp, inputs


def _replayed(rt: Runtime, tenant: str, key: str | None) -> Any:
    """The run an Idempotency-Key already created (a replay is not a new submission)."""
    if not key:
        return None
    with reading(rt.engine) as conn:
        return run_store.find_idempotent(conn, tenant, key)


def _run_input(
    body: RunCreate, tenant: str, agent: Resolved, key: str | None, given: _Given
) -> commands.RunInput:
    inp, inputs = given
    return commands.RunInput(
        agent=agent.spec,
        agent_ref=agent.ref,
        input=inp,
        tenant=tenant,
        thread_id=body.thread_id,
        idempotency_key=key,
        metadata=body.metadata,
        webhook=body.webhook,
        inputs=inputs,
        run_at=body.start_at(run_store.now()),
        priority=body.priority,
        ttl_s=body.ttl_s,
    )


def _own_run(conn: Any, run_id: str, caller: Caller) -> Any:
    run = run_store.get_run(conn, run_id, caller.tenant)
    if run is None:
        raise NotFound(f"run {run_id} not found")
    return run


T = TypeVar("T")


def _owned_rows(
    rt: Runtime, run_id: str, caller: Caller, rows_of: Callable[[Any, str], Sequence[T]]
) -> Sequence[T]:
    """``rows_of(conn, run_id)``, once the run is found to be the caller's (404 if not)."""
    with reading(rt.engine) as conn:
        _own_run(conn, run_id, caller)
        return rows_of(conn, run_id)


router = api_router(prefix="/v1", tags=["runs"])


@router.post(
    "/runs",
    status_code=201,
    response_model=RunView,
    responses={200: {"model": RunView, "description": "An Idempotency-Key replay"}},
)
def submit(
    body: RunCreate,
    response: Response,
    rt: RuntimeDep,
    caller: WriteCaller,
    idempotency_key: Annotated[str | None, Header(min_length=1, max_length=200)] = None,
) -> RunView:
    agent = resolve(body.agent, store_lookup(rt, caller.tenant))
    given = _submit_input(body)
    found = _replayed(rt, caller.tenant, idempotency_key)
    if found is not None:
        response.status_code = 200
        return run_view(found)
    limits.admit(rt, caller, agent.policed, agent.spec, given[0], body.webhook)
    row, created = commands.submit_run(
        rt, _run_input(body, caller.tenant, agent, idempotency_key, given)
    )
    if not created:
        response.status_code = 200
    return run_view(row)


@router.get("/runs", response_model=RunList)
def list_runs(
    request: Request,
    rt: RuntimeDep,
    caller: ReadCaller,
    status: Annotated[list[RunStatus] | None, Query(max_length=7)] = None,
    thread_id: Annotated[str | None, Query(max_length=40)] = None,
    agent: Annotated[str | None, Query(pattern=AGENT_NAME)] = None,
    created_after: Annotated[IsoTime | None, Query()] = None,
    created_before: Annotated[IsoTime | None, Query()] = None,
    ended_after: Annotated[IsoTime | None, Query()] = None,
    ended_before: Annotated[IsoTime | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[str | None, Query(pattern=CURSOR_PATTERN)] = None,
) -> RunList:
    """The tenant's runs, newest first, filtered: ``metadata.<key>=<value>`` (exact,
    up to 8), ``agent``, ``status`` (repeatable), ``thread_id``, creation and end
    ranges (ISO 8601 with an offset; after: inclusive, before: exclusive). Keyset
    paging: pass ``next_cursor`` back as ``cursor``."""
    found = query_filter(
        request,
        agent=agent,
        status=list(status or ()),
        thread_id=thread_id,
        created=(created_after, created_before),
        ended=(ended_after, ended_before),
    )
    with reading(rt.engine) as conn:
        rows = run_store.search_runs(
            conn, caller.tenant, found, limit=limit + 1, before=_parse_cursor(cursor)
        )
    nxt = _cursor(rows[limit - 1]) if len(rows) > limit else None
    return RunList(runs=[run_view(x) for x in rows[:limit]], next_cursor=nxt)


@router.get("/runs/{run_id}", response_model=RunView)
def get_run(run_id: RunId, rt: RuntimeDep, caller: ReadCaller) -> RunView:
    with reading(rt.engine) as conn:
        return run_view(_own_run(conn, run_id, caller))


@router.get("/runs/{run_id}/messages", response_model=MessageList)
def messages(run_id: RunId, rt: RuntimeDep, caller: ReadCaller) -> MessageList:
    rows = _owned_rows(rt, run_id, caller, records.list_messages)
    return MessageList(messages=[message_view(m) for m in rows])


@router.get("/runs/{run_id}/tool-calls", response_model=ToolCallList)
def tool_calls(run_id: RunId, rt: RuntimeDep, caller: ReadCaller) -> ToolCallList:
    rows = _owned_rows(rt, run_id, caller, call_store.list_tool_calls)
    return ToolCallList(tool_calls=[tool_call_view(row) for row in rows])


@router.post("/runs/{run_id}/cancel", response_model=RunView)
def cancel(run_id: RunId, rt: RuntimeDep, caller: WriteCaller) -> RunView:
    return run_view(commands.cancel_run(rt, caller.tenant, run_id))


@router.post("/runs/{run_id}/answer", response_model=RunView)
def answer(
    run_id: RunId,
    body: AnswerBody,
    rt: RuntimeDep,
    caller: ResumeCaller,
    x_resume_token: Annotated[str | None, Header(max_length=200)] = None,
) -> RunView:
    """Answer an ask. Auth: an API key with ``runs:write``, or the ask's resume token (from
    the run.waiting webhook) as ``X-Resume-Token`` or ``Authorization: Bearer rtk_...``."""
    tenant = None if caller.resume_token else caller.tenant
    return run_view(
        commands.answer_run(
            rt, tenant, run_id, body.ask_id, body.answers, token=caller.resume_token
        )
    )


@router.post("/runs/{run_id}/approval", response_model=RunView)
def approval(
    run_id: RunId,
    body: Annotated[ApprovalBody, Body()],
    rt: RuntimeDep,
    caller: ResumeCaller,
    x_resume_token: Annotated[str | None, Header(max_length=200)] = None,
) -> RunView:
    """Approve or reject writes. Auth: ``runs:write``, or the approval's resume token."""
    tenant = None if caller.resume_token else caller.tenant
    by = caller.key_id or ("resume-token" if caller.resume_token else caller.tenant)
    if isinstance(body, ListBody):
        approve, reject, decisions = body.approve, body.reject, None
    else:
        approve, reject, decisions = None, None, body.items()
    row = commands.approve_run(
        rt,
        tenant,
        run_id,
        body.approval_id,
        approve,
        reject,
        body.note,
        token=caller.resume_token,
        decisions=decisions,
        by=by,
    )
    return run_view(row)


@router.get("/runs/{run_id}/webhook-deliveries", response_model=DeliveryList)
def webhook_deliveries(run_id: RunId, rt: RuntimeDep, caller: ReadCaller) -> DeliveryList:
    """Outbound webhook deliveries of the run, each with its attempt log."""
    rows = _owned_rows(rt, run_id, caller, deliveries.list_deliveries)
    return DeliveryList(deliveries=[DeliveryView.model_validate(delivery_view(d)) for d in rows])


@router.get("/runs/{run_id}/events", response_model=None, responses=_SSE_RESPONSES)
def events(
    run_id: RunId,
    rt: RuntimeDep,
    caller: ReadCaller,
    after: Annotated[int | None, Query(ge=0, le=2**31)] = None,
    last_event_id: Annotated[str | None, Header(max_length=20)] = None,
) -> Response:
    """SSE: durable events after ``Last-Event-ID`` (or ``?after=``), then live; ends after
    the terminal event. 204 when the run is over and the client has seen its last event
    (an EventSource stops reconnecting on 204)."""
    with reading(rt.engine) as conn:
        run = _own_run(conn, run_id, caller)
    start = after or 0
    if last_event_id and last_event_id.strip().isdigit():
        start = int(last_event_id.strip())
    if run["status"] in commands.FINAL and start >= run["event_seq"]:
        return Response(status_code=204)
    return StreamingResponse(
        event_stream(rt, run_id, start),
        media_type="text/event-stream",
        headers=SSE_HEADERS,
    )
