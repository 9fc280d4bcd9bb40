"""The FastAPI application (DESIGN §7)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import sqlalchemy as sa
from fastapi import APIRouter, FastAPI, Header, Query, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from scheduler.agents import resolve_agent
from scheduler.console import EventsQueryToken, console_router
from scheduler.deliveries import delivery_view, resume_token
from scheduler.errors import install_error_handlers
from scheduler.files_api import files_router, upload_overhead
from scheduler.schemas import (
    AnswerBody,
    ApprovalBody,
    RunCreate,
    RunList,
    RunView,
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

TENANT = "default"


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


def _runs_router(get_rt: Callable[[], Runtime]) -> APIRouter:
    r = APIRouter(prefix="/v1", tags=["runs"])

    @r.post("/runs", status_code=201, response_model=RunView)
    def submit(body: RunCreate, response: Response,
               idempotency_key: Annotated[str | None, Header(max_length=200)] = None) -> RunView:
        spec = resolve_agent(body.agent)
        inp: str | list[dict[str, Any]] = (
            body.input if isinstance(body.input, str) else [m.model_dump() for m in body.input]
        )
        inputs: dict[str, Any] = {}
        if body.quotes:
            inputs["quotes"] = [q.model_dump(exclude_none=True) for q in body.quotes]
        if body.attachments:
            inputs["attachments"] = body.attachments
        row, created = commands.submit_run(get_rt(), commands.RunInput(
            agent=spec, input=inp, tenant=TENANT, thread_id=body.thread_id,
            idempotency_key=idempotency_key, metadata=body.metadata, webhook=body.webhook,
            inputs=inputs,
        ))
        if not created:
            response.status_code = 200
        return run_view(row)

    @r.get("/runs", response_model=RunList)
    def list_runs(status: str | None = None, thread_id: str | None = None,
                  limit: Annotated[int, Query(ge=1, le=200)] = 50,
                  cursor: str | None = None) -> RunList:
        with get_rt().engine.connect() as conn:
            rows = repo.list_runs(conn, TENANT, status=status, thread_id=thread_id,
                                  limit=limit + 1, before=_parse_cursor(cursor))
        nxt = _cursor(rows[limit - 1]) if len(rows) > limit else None
        return RunList(runs=[run_view(x) for x in rows[:limit]], next_cursor=nxt)

    @r.get("/runs/{run_id}", response_model=RunView)
    def get_run(run_id: str) -> RunView:
        with get_rt().engine.connect() as conn:
            row = repo.get_run(conn, run_id, TENANT)
        if row is None:
            raise NotFound(f"run {run_id} not found")
        return run_view(row)

    @r.get("/runs/{run_id}/messages")
    def messages(run_id: str) -> dict[str, Any]:
        with get_rt().engine.connect() as conn:
            if repo.get_run(conn, run_id, TENANT) is None:
                raise NotFound(f"run {run_id} not found")
            rows = repo.list_messages(conn, run_id)
        return {"messages": [message_view(m).model_dump() for m in rows]}

    @r.get("/runs/{run_id}/tool-calls")
    def tool_calls(run_id: str) -> dict[str, Any]:
        with get_rt().engine.connect() as conn:
            if repo.get_run(conn, run_id, TENANT) is None:
                raise NotFound(f"run {run_id} not found")
            rows = repo.list_tool_calls(conn, run_id)
        keep = ("call_id", "round", "idx", "name", "arguments", "read_only", "status", "attempts",
                "result", "error", "cost", "started_at", "finished_at")
        return {"tool_calls": [{k: row[k] for k in keep} for row in rows]}

    @r.post("/runs/{run_id}/cancel", response_model=RunView)
    def cancel(run_id: str) -> RunView:
        return run_view(commands.cancel_run(get_rt(), TENANT, run_id))

    @r.post("/runs/{run_id}/answer", response_model=RunView)
    def answer(run_id: str, body: AnswerBody,
               authorization: Annotated[str | None, Header()] = None,
               x_resume_token: Annotated[str | None, Header()] = None) -> RunView:
        """Answer an ask. Auth: the API key, or the ask's resume token (from the run.waiting
        webhook) as ``X-Resume-Token`` or ``Authorization: Bearer rtk_...``."""
        token = resume_token(authorization, x_resume_token)
        return run_view(commands.answer_run(get_rt(), TENANT, run_id, body.ask_id, body.answers,
                                            token=token))

    @r.post("/runs/{run_id}/approval", response_model=RunView)
    def approval(run_id: str, body: ApprovalBody,
                 authorization: Annotated[str | None, Header()] = None,
                 x_resume_token: Annotated[str | None, Header()] = None) -> RunView:
        """Approve or reject writes. Auth: the API key, or the approval's resume token."""
        token = resume_token(authorization, x_resume_token)
        row = commands.approve_run(get_rt(), TENANT, run_id, body.approval_id, body.approve,
                                   body.reject, body.note, token=token)
        return run_view(row)

    @r.get("/runs/{run_id}/webhook-deliveries")
    def webhook_deliveries(run_id: str) -> dict[str, Any]:
        """Outbound webhook deliveries of the run, each with its attempt log."""
        with get_rt().engine.connect() as conn:
            if repo.get_run(conn, run_id, TENANT) is None:
                raise NotFound(f"run {run_id} not found")
            rows = deliveries.list_deliveries(conn, run_id)
        return {"deliveries": [delivery_view(d) for d in rows]}

    @r.get("/runs/{run_id}/events", response_model=None)
    def events(run_id: str, after: Annotated[int | None, Query(ge=0)] = None,
               last_event_id: Annotated[str | None, Header()] = None) -> Response:
        """SSE: durable events after ``Last-Event-ID`` (or ``?after=``), then live; ends after
        the terminal event. 204 when the run is over and the client has seen its last event
        (an EventSource stops reconnecting on 204)."""
        rt = get_rt()
        with rt.engine.connect() as conn:
            run = repo.get_run(conn, run_id, TENANT)
        if run is None:
            raise NotFound(f"run {run_id} not found")
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

    @r.get("/metrics", include_in_schema=False)
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


def create_app(get_rt: Callable[[], Runtime] | None = None) -> FastAPI:
    if get_rt is None:
        from worker.runtime import get_runtime

        get_rt = get_runtime
    app = FastAPI(title="treadle", version="0.1.0",
                  description="Durable, distributed execution of LLM agents on Celery.")
    install_error_handlers(app)
    app.include_router(_runs_router(get_rt))
    app.include_router(threads_router(get_rt, TENANT))
    app.include_router(_ops_router(get_rt))
    app.include_router(files_router(get_rt, TENANT))
    app.include_router(console_router(get_rt, TENANT))
    app.add_middleware(EventsQueryToken)  # ?access_token= on the SSE route (EventSource)

    @app.middleware("http")
    async def _body_limit(request: Request, call_next: Any) -> Any:
        length = request.headers.get("content-length")
        limit, message = 2_000_000, "request body over 2 MB"
        if request.url.path == "/v1/files":  # uploads: the file size limit (setting)
            max_file = get_rt().settings.files_max_bytes
            limit, message = max_file + upload_overhead, f"file over the {max_file}-byte limit"
        if length and length.isdigit() and int(length) > limit:
            return JSONResponse({"error": {"code": "too_large", "message": message}},
                                status_code=413)
        return await call_next(request)

    return app
