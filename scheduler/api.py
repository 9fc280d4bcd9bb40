"""The FastAPI application (DESIGN §7)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Annotated, Any

import sqlalchemy as sa
from fastapi import APIRouter, Depends, FastAPI, Header, Query, Response
from fastapi.responses import JSONResponse, StreamingResponse

from scheduler import limits
from scheduler.agents import resolve_agent
from scheduler.auth import (
    Authenticator,
    AuthMiddleware,
    Caller,
    ReadCaller,
    RedactKeys,
    ResumeCaller,
    WriteCaller,
    metrics_access,
)
from scheduler.console import EventsQueryToken, console_router
from scheduler.datasets_api import datasets_router
from scheduler.deliveries import DeliveryList, DeliveryView, delivery_view
from scheduler.errors import install_error_handlers
from scheduler.files_api import files_router, upload_overhead
from scheduler.interop.langgraph import langgraph_router
from scheduler.interop.openai_responses import openai_router
from scheduler.openapi import install_openapi
from scheduler.schemas import (
    ERROR_RESPONSES,
    AnswerBody,
    ApprovalBody,
    MessageList,
    PathId,
    RunCreate,
    RunList,
    RunView,
    ToolCallList,
    ToolCallRow,
    message_view,
    run_view,
)
from scheduler.sse import event_stream
from scheduler.threads_api import threads_router
from shared.engine import commands, metrics
from shared.engine.runtime import Runtime
from shared.errors import NotFound, SpecError
from shared.store import deliveries, repo

__all__ = ["create_app"]

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


def _submit_input(body: RunCreate) -> tuple[str | list[dict[str, Any]], dict[str, Any]]:
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
    with rt.engine.connect() as conn:
        return repo.find_idempotent(conn, tenant, key)


def _runs_router(get_rt: Callable[[], Runtime]) -> APIRouter:
    r = APIRouter(prefix="/v1", tags=["runs"])

    @r.post("/runs", status_code=201, response_model=RunView,
            responses={200: {"model": RunView, "description": "An Idempotency-Key replay"}})
    def submit(body: RunCreate, response: Response, caller: WriteCaller,
               idempotency_key: Annotated[str | None, Header(max_length=200)] = None) -> RunView:
        rt = get_rt()
        spec = resolve_agent(body.agent)
        inp, inputs = _submit_input(body)
        found = _replayed(rt, caller.tenant, idempotency_key)
        if found is not None:
            response.status_code = 200
            return run_view(found)
        limits.admit(rt, caller, body.agent, spec, inp, body.webhook)
        row, created = commands.submit_run(rt, commands.RunInput(
            agent=spec, input=inp, tenant=caller.tenant, thread_id=body.thread_id,
            idempotency_key=idempotency_key, metadata=body.metadata, webhook=body.webhook,
            inputs=inputs,
        ))
        if not created:
            response.status_code = 200
        return run_view(row)

    @r.get("/runs", response_model=RunList)
    def list_runs(caller: ReadCaller, status: Annotated[str | None, Query(max_length=16)] = None,
                  thread_id: Annotated[str | None, Query(max_length=40)] = None,
                  limit: Annotated[int, Query(ge=1, le=200)] = 50,
                  cursor: Annotated[str | None, Query(max_length=200)] = None) -> RunList:
        with get_rt().engine.connect() as conn:
            rows = repo.list_runs(conn, caller.tenant, status=status, thread_id=thread_id,
                                  limit=limit + 1, before=_parse_cursor(cursor))
        nxt = _cursor(rows[limit - 1]) if len(rows) > limit else None
        return RunList(runs=[run_view(x) for x in rows[:limit]], next_cursor=nxt)

    def own_run(conn: Any, run_id: str, caller: Caller) -> Any:
        run = repo.get_run(conn, run_id, caller.tenant)
        if run is None:
            raise NotFound(f"run {run_id} not found")
        return run

    @r.get("/runs/{run_id}", response_model=RunView)
    def get_run(run_id: RunId, caller: ReadCaller) -> RunView:
        with get_rt().engine.connect() as conn:
            return run_view(own_run(conn, run_id, caller))

    @r.get("/runs/{run_id}/messages", response_model=MessageList)
    def messages(run_id: RunId, caller: ReadCaller) -> MessageList:
        with get_rt().engine.connect() as conn:
            own_run(conn, run_id, caller)
            rows = repo.list_messages(conn, run_id)
        return MessageList(messages=[message_view(m) for m in rows])

    @r.get("/runs/{run_id}/tool-calls", response_model=ToolCallList)
    def tool_calls(run_id: RunId, caller: ReadCaller) -> ToolCallList:
        with get_rt().engine.connect() as conn:
            own_run(conn, run_id, caller)
            rows = repo.list_tool_calls(conn, run_id)
        return ToolCallList(tool_calls=[ToolCallRow.model_validate(dict(row)) for row in rows])

    @r.post("/runs/{run_id}/cancel", response_model=RunView)
    def cancel(run_id: RunId, caller: WriteCaller) -> RunView:
        return run_view(commands.cancel_run(get_rt(), caller.tenant, run_id))

    @r.post("/runs/{run_id}/answer", response_model=RunView)
    def answer(run_id: RunId, body: AnswerBody, caller: ResumeCaller,
               x_resume_token: Annotated[str | None, Header(max_length=200)] = None) -> RunView:
        """Answer an ask. Auth: an API key with ``runs:write``, or the ask's resume token (from
        the run.waiting webhook) as ``X-Resume-Token`` or ``Authorization: Bearer rtk_...``."""
        tenant = None if caller.resume_token else caller.tenant
        return run_view(commands.answer_run(get_rt(), tenant, run_id, body.ask_id, body.answers,
                                            token=caller.resume_token))

    @r.post("/runs/{run_id}/approval", response_model=RunView)
    def approval(run_id: RunId, body: ApprovalBody, caller: ResumeCaller,
                 x_resume_token: Annotated[str | None, Header(max_length=200)] = None) -> RunView:
        """Approve or reject writes. Auth: ``runs:write``, or the approval's resume token."""
        tenant = None if caller.resume_token else caller.tenant
        row = commands.approve_run(get_rt(), tenant, run_id, body.approval_id, body.approve,
                                   body.reject, body.note, token=caller.resume_token)
        return run_view(row)

    @r.get("/runs/{run_id}/webhook-deliveries", response_model=DeliveryList)
    def webhook_deliveries(run_id: RunId, caller: ReadCaller) -> DeliveryList:
        """Outbound webhook deliveries of the run, each with its attempt log."""
        with get_rt().engine.connect() as conn:
            own_run(conn, run_id, caller)
            rows = deliveries.list_deliveries(conn, run_id)
        return DeliveryList(deliveries=[DeliveryView.model_validate(delivery_view(d))
                                        for d in rows])

    @r.get("/runs/{run_id}/events", response_model=None, responses=_SSE_RESPONSES)
    def events(run_id: RunId, caller: ReadCaller,
               after: Annotated[int | None, Query(ge=0, le=2**31)] = None,
               last_event_id: Annotated[str | None, Header(max_length=20)] = None) -> Response:
        """SSE: durable events after ``Last-Event-ID`` (or ``?after=``), then live; ends after
        the terminal event. 204 when the run is over and the client has seen its last event
        (an EventSource stops reconnecting on 204)."""
        rt = get_rt()
        with rt.engine.connect() as conn:
            run = own_run(conn, run_id, caller)
        start = after or 0
        if last_event_id and last_event_id.strip().isdigit():
            start = int(last_event_id.strip())
        if run["status"] in commands.FINAL and start >= run["event_seq"]:
            return Response(status_code=204)
        return StreamingResponse(event_stream(rt, run_id, start), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    return r


def _ops_router(get_rt: Callable[[], Runtime]) -> APIRouter:
    r = APIRouter(tags=["ops"])

    @r.get("/healthz")
    def healthz() -> JSONResponse:
        rt = get_rt()
        checks = {"database": _check_db(rt), "broker": _check_broker(rt)}
        ok = all(v == "ok" for v in checks.values())
        return JSONResponse({"status": "ok" if ok else "degraded", "checks": checks},
                            status_code=200 if ok else 503)

    @r.get("/metrics", include_in_schema=False, dependencies=[Depends(metrics_access)])
    def prometheus() -> Response:
        rt = get_rt()
        collector = metrics.StateCollector(lambda: _runs_by_status(rt), lambda: _queue_depth(rt))
        return Response(metrics.render(collector), media_type=metrics.CONTENT_TYPE_LATEST)

    return r


def _runs_by_status(rt: Runtime) -> dict[str, int]:
    from shared.store.tables import runs

    with rt.engine.connect() as conn:
        rows = conn.execute(sa.select(runs.c.status, sa.func.count()).group_by(runs.c.status))
        return {str(status): int(n) for status, n in rows}


def _queue_depth(rt: Runtime) -> dict[str, int]:
    if not rt.settings.broker_url.startswith(("redis://", "rediss://")):
        return {}
    import redis

    client = redis.Redis.from_url(rt.settings.broker_url, socket_timeout=2)
    prefix = rt.settings.broker_prefix
    try:
        return {q: int(client.llen(f"{prefix}{q}"))
                for q in ("treadle.rounds", "treadle.tools", "treadle.webhooks")}
    finally:
        client.close()


def _check_db(rt: Runtime) -> str:
    try:
        with rt.engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
        return "ok"
    except Exception as exc:
        return f"error: {type(exc).__name__}"


def _check_broker(rt: Runtime) -> str:
    if rt.settings.embedded:
        return "ok"
    try:
        from worker.app import app

        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
        return "ok"
    except Exception as exc:
        return f"error: {type(exc).__name__}"


def _body_limit_for(get_rt: Callable[[], Runtime]) -> Callable[[str], tuple[int, str]]:
    def limit_for(path: str) -> tuple[int, str]:
        if path == "/v1/files":  # uploads: the file size limit (setting)
            max_file = get_rt().settings.files_max_bytes
            return max_file + upload_overhead, f"file over the {max_file}-byte limit"
        return limits.BODY_LIMIT, "request body over 2 MB"

    return limit_for


def _redact_access_logs() -> None:
    for name in ("uvicorn.access", "uvicorn.error"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactKeys) for f in logger.filters):
            logger.addFilter(RedactKeys())


def create_app(
    get_rt: Callable[[], Runtime] | None = None, *, auth: str | None = None
) -> FastAPI:
    """The API. ``auth``: ``"required"`` or ``"off"``; None = ``TREADLE_AUTH``, or by default
    off only for embedded mode on loopback (``scheduler.auth.auth_mode``)."""
    if get_rt is None:
        from worker.runtime import get_runtime

        get_rt = get_runtime
    app = FastAPI(title="treadle", version="0.1.0",
                  description="Durable, distributed execution of LLM agents on Celery.")
    app.state.auth = authenticator = Authenticator(get_rt, auth)
    install_error_handlers(app)
    app.include_router(_runs_router(get_rt))
    app.include_router(threads_router(get_rt))
    app.include_router(_ops_router(get_rt))
    app.include_router(files_router(get_rt))
    app.include_router(datasets_router(get_rt), responses=ERROR_RESPONSES)  # issue #10
    app.include_router(console_router(get_rt))
    app.include_router(langgraph_router(get_rt), prefix="/langgraph")  # interop (issue #16)
    app.include_router(openai_router(get_rt), prefix="/openai/v1")
    # outermost last: body size, then ?access_token= (EventSource), then the key check
    app.add_middleware(AuthMiddleware, auth=authenticator)
    app.add_middleware(EventsQueryToken)  # ?access_token= on the SSE route (EventSource)
    app.add_middleware(limits.BodyLimit, limit_for=_body_limit_for(get_rt))
    install_openapi(app)
    _redact_access_logs()
    return app
