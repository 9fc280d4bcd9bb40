"""``/a2a/{agent}``: each named agent as an A2A server (docs/a2a.md), through the official
``a2a-sdk``: its JSON-RPC dispatcher (A2A 1.0 methods, and the 0.3 names ``message/send``,
``message/stream``, ``tasks/get``, ``tasks/cancel``), behind the API's keys and tenants.

* ``GET /a2a/{agent}/.well-known/agent-card.json``: the agent card; its skills come from the
  agent's spec (the agent itself, then each of its tools).
* A task is a run (``shared.interop.a2a_shapes``), its context the run's thread: a message
  without ``taskId`` starts a run (on the thread its ``contextId`` names, made when new); a
  message with the ``taskId`` of a task in ``input-required`` answers its pause (an ask: one
  text part per question; an approval: ``approve`` / ``reject``, or a data part
  ``{"approve": [call ids], "note"}``).
* ``message/send`` waits up to ``TREADLE_CALL_WAIT_S`` for the task to end or need input (not
  at all with ``returnImmediately``); ``message/stream`` streams the task, its progress, the
  result artifact and the final status; ``tasks/get``, ``tasks/cancel``, ``tasks/list``,
  ``tasks/subscribe``.
* Push notifications: ``taskPushNotificationConfig`` on a send makes the run's webhook (a
  tenant's URL passes the SSRF rules), signed like every treadle webhook; its body is the
  task (``{"task": ...}``) at each pause and at the end.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator
from typing import Annotated, NoReturn

import anyio
from a2a.server.context import ServerCallContext
from a2a.server.events.event_queue import Event
from a2a.server.request_handlers.request_handler import RequestHandler, validate_request_params
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.server.routes import DefaultServerCallContextBuilder, create_jsonrpc_routes
from a2a.types import a2a_pb2 as pb
from a2a.utils import errors as a2a_errors
from fastapi import FastAPI, Path, Request
from fastapi.responses import JSONResponse
from google.protobuf.json_format import MessageToDict, ParseDict
from starlette.concurrency import run_in_threadpool

from scheduler.http.agent_routes import read_agent
from scheduler.http.agents import resolve, store_lookup
from scheduler.http.auth import CALLER_KEY, Caller, ReadCaller
from scheduler.http.deps import RuntimeDep
from scheduler.http.errors import ApiError
from scheduler.http.routing import api_router
from scheduler.http.tail import Batch, follow
from scheduler.interop.a2a import answers
from scheduler.interop.a2a.card import agent_card
from scheduler.interop.common import progress_text
from shared.engine.runtime import Runtime
from shared.errors import NotFound, SpecError, TreadleError
from shared.interop.a2a_shapes import task_json
from shared.store import keys
from shared.store.rows import FINAL, RunRecord, Status
from shared.vocab import SEGMENT_ENDS, EventType

__all__ = ["A2aHandler", "install_a2a", "router"]

router = api_router(tags=["a2a"])
AgentName = Annotated[str, Path(max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
PROGRESS = frozenset(
    {
        EventType.ROUND_STARTED,
        EventType.TOOL_FINISHED,
        EventType.MEMORY_READ,
        EventType.MEMORY_WRITTEN,
    }
)


class _Context(DefaultServerCallContextBuilder):
    """Each call's context: the API's caller, the agent (the path's), the runtime."""

    def build(self, request: Request) -> ServerCallContext:
        context = super().build(request)
        context.state.update(
            caller=request.scope.get(CALLER_KEY),
            agent=str(request.path_params.get("agent", "")),
            rt=request.app.state.get_rt(),
        )
        return context


def _who(context: ServerCallContext, scope: str) -> tuple[Runtime, Caller, str]:
    caller = context.state.get("caller")
    if not isinstance(caller, Caller):
        raise a2a_errors.InvalidRequestError(message="an API key is required")
    if not caller.allows(scope):
        raise a2a_errors.InvalidRequestError(message=f"this API key lacks the {scope} scope")
    rt: Runtime = context.state["rt"]
    return rt, caller, str(context.state.get("agent") or "")


def _refused(exc: Exception) -> NoReturn:
    """A treadle refusal as an A2A error (the JSON-RPC error a client reads)."""
    if isinstance(exc, ApiError):
        raise a2a_errors.InvalidRequestError(message=str(exc.detail)) from None
    if isinstance(exc, NotFound | SpecError):
        raise a2a_errors.InvalidParamsError(message=str(exc)) from None
    raise a2a_errors.InvalidRequestError(message=str(exc)) from None


def _task(record: RunRecord) -> pb.Task:
    task: pb.Task = ParseDict(task_json(record.run), pb.Task(), ignore_unknown_fields=True)
    return task


async def _record(rt: Runtime, tenant: str, agent: str, run_id: str) -> RunRecord:
    """The caller's run of this agent, or TaskNotFoundError."""
    record = await run_in_threadpool(answers.record_of, rt, tenant, run_id[:64])
    if record is None or answers.agent_of(record) != agent:
        raise a2a_errors.TaskNotFoundError(message=f"task {run_id[:64]} not found")
    return record


def _status_event(record: RunRecord, text: str | None = None) -> pb.TaskStatusUpdateEvent:
    task = _task(record)
    event = pb.TaskStatusUpdateEvent(
        task_id=task.id, context_id=task.context_id, status=task.status
    )
    if text is not None:  # progress while it works
        event.status.message.CopyFrom(
            pb.Message(
                message_id=str(uuid.uuid4()),
                role=pb.ROLE_AGENT,
                task_id=task.id,
                context_id=task.context_id,
                parts=[pb.Part(text=text)],
            )
        )
    return event


class A2aHandler(RequestHandler):
    """The A2A methods over treadle runs: state in the database, none in this process."""

    async def _begin(
        self, params: pb.SendMessageRequest, context: ServerCallContext
    ) -> tuple[Runtime, Caller, str, int]:
        """Start a run, or answer the pause of the message's task; the run and where to
        follow it from."""
        rt, caller, agent = _who(context, keys.WRITE)
        message = params.message
        try:
            if message.task_id:
                record = await _record(rt, caller.tenant, agent, message.task_id)
                await run_in_threadpool(answers.answer, rt, caller, record, message)
                return rt, caller, record.run.id, record.run.event_seq
            meta = MessageToDict(params.metadata) if params.HasField("metadata") else {}
            run_id = await run_in_threadpool(
                answers.start, rt, caller, agent, message, params.configuration, meta
            )
        except (TreadleError, ApiError) as exc:
            _refused(exc)
        return rt, caller, run_id, 0

    @validate_request_params
    async def on_message_send(
        self, params: pb.SendMessageRequest, context: ServerCallContext
    ) -> pb.Task | pb.Message:
        rt, caller, run_id, cursor = await self._begin(params, context)
        if not params.configuration.return_immediately:
            with anyio.move_on_after(rt.settings.call_wait_s):
                async for item in follow(rt, run_id, cursor, ends=SEGMENT_ENDS, live=False):
                    if isinstance(item, Batch) and item.last:
                        break
        return _task(await _record(rt, caller.tenant, context.state["agent"], run_id))

    @validate_request_params
    async def on_message_send_stream(
        self, params: pb.SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        rt, caller, run_id, cursor = await self._begin(params, context)
        async for event in self._stream(rt, caller, context.state["agent"], run_id, cursor):
            yield event

    async def _stream(
        self, rt: Runtime, caller: Caller, agent: str, run_id: str, cursor: int
    ) -> AsyncGenerator[Event]:
        """The task now, its progress while it works, then its artifact and final status
        (or its need for input); the stream ends there."""
        record = await _record(rt, caller.tenant, agent, run_id)
        yield _task(record)
        if record.run.status in FINAL:
            return
        async for item in follow(rt, run_id, cursor, ends=SEGMENT_ENDS, live=False):
            if not isinstance(item, Batch):
                continue
            if not item.last:
                for ev in item.events:
                    if ev["type"] in PROGRESS:
                        yield _status_event(record, progress_text(ev))
                continue
            record = await _record(rt, caller.tenant, agent, run_id)
            task = _task(record)
            for artifact in task.artifacts:
                yield pb.TaskArtifactUpdateEvent(
                    task_id=task.id, context_id=task.context_id, artifact=artifact, last_chunk=True
                )
            yield _status_event(record)
            return

    @validate_request_params
    async def on_get_task(
        self, params: pb.GetTaskRequest, context: ServerCallContext
    ) -> pb.Task | None:
        rt, caller, agent = _who(context, keys.READ)
        return _task(await _record(rt, caller.tenant, agent, params.id))

    @validate_request_params
    async def on_cancel_task(
        self, params: pb.CancelTaskRequest, context: ServerCallContext
    ) -> pb.Task | None:
        rt, caller, agent = _who(context, keys.WRITE)
        record = await _record(rt, caller.tenant, agent, params.id)
        if record.run.status in FINAL:
            raise a2a_errors.TaskNotCancelableError(
                message=f"task {params.id} is already {record.run.status.value}"
            )
        await run_in_threadpool(answers.cancel, rt, caller.tenant, record.run.id)
        return _task(await _record(rt, caller.tenant, agent, params.id))

    @validate_request_params
    async def on_list_tasks(
        self, params: pb.ListTasksRequest, context: ServerCallContext
    ) -> pb.ListTasksResponse:
        rt, caller, agent = _who(context, keys.READ)
        size = max(1, min(params.page_size or 50, 100))
        found = await run_in_threadpool(
            answers.tasks_of, rt, caller.tenant, agent, params.context_id, size
        )
        tasks = [_task(r) for r in found]
        return pb.ListTasksResponse(tasks=tasks, page_size=size, total_size=len(tasks))

    @validate_request_params
    async def on_subscribe_to_task(
        self, params: pb.SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        rt, caller, agent = _who(context, keys.READ)
        record = await _record(rt, caller.tenant, agent, params.id)
        cursor = record.run.event_seq
        if record.run.status == Status.WAITING:  # it waits: follow on past its pause
            cursor = max(0, cursor - 1)
        async for event in self._stream(rt, caller, agent, record.run.id, cursor):
            yield event

    async def on_create_task_push_notification_config(
        self, params: pb.TaskPushNotificationConfig, context: ServerCallContext
    ) -> pb.TaskPushNotificationConfig:
        raise a2a_errors.UnsupportedOperationError(
            message="give taskPushNotificationConfig with message/send (the run's webhook)"
        )

    async def on_get_task_push_notification_config(
        self, params: pb.GetTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> pb.TaskPushNotificationConfig:
        rt, caller, agent = _who(context, keys.READ)
        record = await _record(rt, caller.tenant, agent, params.task_id)
        config = answers.push_config(record)
        if config is None:
            raise a2a_errors.InvalidParamsError(message="the task has no push notifications")
        return config

    async def on_list_task_push_notification_configs(
        self, params: pb.ListTaskPushNotificationConfigsRequest, context: ServerCallContext
    ) -> pb.ListTaskPushNotificationConfigsResponse:
        rt, caller, agent = _who(context, keys.READ)
        config = answers.push_config(await _record(rt, caller.tenant, agent, params.task_id))
        return pb.ListTaskPushNotificationConfigsResponse(configs=[config] if config else [])

    async def on_delete_task_push_notification_config(
        self, params: pb.DeleteTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> None:
        raise a2a_errors.UnsupportedOperationError(message="a run's webhook stays with it")

    async def on_get_extended_agent_card(
        self, params: pb.GetExtendedAgentCardRequest, context: ServerCallContext
    ) -> pb.AgentCard:
        raise a2a_errors.ExtendedAgentCardNotConfiguredError(message="no extended card")


@router.get("/a2a/{agent}/.well-known/agent-card.json", include_in_schema=False)
def card(agent: AgentName, request: Request, rt: RuntimeDep, caller: ReadCaller) -> JSONResponse:
    """The agent's card (404 when the caller's tenant has no such agent)."""
    view = read_agent(rt, caller.tenant, agent)
    spec = resolve(agent, store_lookup(rt, caller.tenant)).spec
    url = str(request.base_url).rstrip("/") + f"/a2a/{agent}"
    built = agent_card(agent, spec, view.description, url)
    return JSONResponse(agent_card_to_dict(built))


def install_a2a(app: FastAPI) -> None:
    """The card route and each agent's JSON-RPC endpoint (``POST /a2a/{agent}``)."""
    app.include_router(router)
    routes = create_jsonrpc_routes(
        A2aHandler(), rpc_url="/a2a/{agent}", context_builder=_Context(), enable_v0_3_compat=True
    )
    app.router.routes.extend(routes)
