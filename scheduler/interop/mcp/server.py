"""``/mcp``: treadle as an MCP server (docs/mcp.md), with the official ``mcp`` SDK over
streamable HTTP, mounted on the API app behind its keys and tenants.

Each named agent a caller may run is a tool: the operator's registered agents (or those
``TREADLE_MCP_AGENTS`` names) and the caller's tenant's own agents; a key of another tenant
sees none of them. A tool's input is ``{input, thread_id?, metadata?}``; an agent with an
``output_schema`` declares it as the tool's output schema (or a run's handle, for a run still
going or paused). A call runs the agent (``scheduler.interop.mcp.calls``). Each run is also a
resource, ``treadle://runs/{id}`` (its view as ``GET /v1/runs/{id}`` shows it), to read, and
to subscribe to (``resources/subscribe`` on a 2025 session, ``subscriptions/listen`` on the
2026-07-28 protocol): an update is sent as the run moves.

Both protocol eras are served: 2025 sessions (the ``initialize`` handshake; the session
lives in the API process that opened it) and the stateless 2026-07-28 requests. The SDK's
session manager runs in the app's lifespan (``McpService.running``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
from mcp import MCPError
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ResourceUpdated
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope, Send

from scheduler.http.agents import registered_agents
from scheduler.http.auth import CALLER_KEY, Caller
from scheduler.http.errors import ApiError, error_response
from scheduler.http.schemas import run_view
from scheduler.http.tail import TERMINAL, Batch, follow
from scheduler.interop.mcp import calls
from shared.agent.spec import AgentSpec
from shared.engine.runtime import Runtime
from shared.errors import TreadleError
from shared.store import agents as agent_store
from shared.store import keys
from shared.store.db import reading

__all__ = ["McpService"]

MAX_TOOLS = 200
RUN_TEMPLATE = calls.RUN_URI + "{run_id}"
INSTRUCTIONS = (
    "Each tool runs a treadle agent durably. A run that takes long answers with its run id "
    "and a resource (treadle://runs/{id}) to read later; a question or an approval the agent "
    "needs comes as an elicitation, or with a resume token."
)


def _who(ctx: Any) -> tuple[Runtime, Caller]:
    """The app's runtime and the request's caller (left by the API's key check)."""
    request = ctx.request
    caller = request.scope.get(CALLER_KEY) if request is not None else None
    if not isinstance(caller, Caller):
        raise MCPError(types.INVALID_REQUEST, "no caller: an API key is required")
    rt: Runtime = request.app.state.get_rt()
    return rt, caller


def _description(name: str, spec: AgentSpec, described: str | None) -> str:
    if described:
        return described[:2000]
    first = spec.system_prompt.strip().split("\n", 1)[0][:300]
    return f"Run the treadle agent {name!r} ({spec.kind})" + (f": {first}" if first else "")


def _tool(name: str, spec: AgentSpec, described: str | None) -> types.Tool:
    output = None
    if spec.output_schema is not None:
        output = {"type": "object", "anyOf": [spec.output_schema, calls.HANDLE_SCHEMA]}
    return types.Tool(
        name=name,
        description=_description(name, spec, described),
        input_schema=calls.INPUT_SCHEMA,
        output_schema=output,
    )


def served_agents(rt: Runtime, tenant: str) -> dict[str, types.Tool]:
    """The agents the tenant may run over MCP, as tools: the registered ones (or those
    ``TREADLE_MCP_AGENTS`` names), then the tenant's own (a registered name wins)."""
    allow = {a.strip() for a in rt.settings.mcp_agents.split(",") if a.strip()}
    out: dict[str, types.Tool] = {}
    for name, raw in registered_agents().items():
        if not allow or name in allow:
            out[name] = _tool(name, AgentSpec.model_validate(raw), None)
    with reading(rt.engine) as conn:
        own = agent_store.latest_versions(conn, tenant, limit=MAX_TOOLS)
    for v in own:
        if v.name not in out and (not allow or v.name in allow):
            out[v.name] = _tool(v.name, AgentSpec.model_validate(v.spec), v.description)
    return dict(list(out.items())[:MAX_TOOLS])


class McpService:
    """The MCP server of one app: its handlers, and the session manager while the app runs
    (``running``, in the app's lifespan). The app's ``/mcp`` route is this object."""

    def __init__(self) -> None:
        self.server: Server[Any] = Server(
            "treadle",
            version="0.1.0",
            instructions=INSTRUCTIONS,
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_list_resources=self._list_resources,
            on_list_resource_templates=self._list_templates,
            on_read_resource=self._read_resource,
            on_subscribe_resource=self._subscribe,
            on_unsubscribe_resource=self._unsubscribe,
            on_subscriptions_listen=self._listen,
        )
        self.manager: StreamableHTTPSessionManager | None = None
        self._watches: dict[tuple[int, str], anyio.CancelScope] = {}
        self._tasks: anyio.abc.TaskGroup | None = None

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Serve while the block runs (a fresh session manager each time: the SDK's runs
        once)."""
        manager = StreamableHTTPSessionManager(app=self.server, max_sessions=1000)
        async with manager.run(), anyio.create_task_group() as tasks:
            self.manager, self._tasks = manager, tasks
            try:
                yield
            finally:
                self.manager, self._tasks = None, None
                tasks.cancel_scope.cancel()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.manager is None:
            refused = ApiError(503, "unavailable", "the MCP server is not running (lifespan)")
            await error_response(refused)(scope, receive, send)
            return
        caller = scope.get(CALLER_KEY)
        if isinstance(caller, Caller):  # a 2025 session is bound to the key that opened it
            who = caller.key_id or f"tenant:{caller.tenant}"
            token = AccessToken(token="-", client_id=who, scopes=sorted(caller.scopes))
            scope = {**scope, "user": AuthenticatedUser(token)}
        await self.manager.handle_request(scope, receive, send)

    # --- tools -----------------------------------------------------------------------------

    async def _list_tools(
        self, ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        rt, caller = _who(ctx)
        if not caller.allows(keys.READ):
            raise MCPError(types.INVALID_REQUEST, f"this API key lacks the {keys.READ} scope")
        tools = await run_in_threadpool(served_agents, rt, caller.tenant)
        return types.ListToolsResult(tools=list(tools.values()))

    async def _call_tool(
        self, ctx: Any, params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        rt, caller = _who(ctx)
        if not caller.allows(keys.WRITE):
            return _error(f"this API key lacks the {keys.WRITE} scope")
        tools = await run_in_threadpool(served_agents, rt, caller.tenant)
        tool = tools.get(params.name)
        if tool is None:
            raise MCPError(types.INVALID_PARAMS, f"unknown tool {params.name!r}")
        try:
            if params.request_state is not None:
                return await self._resumed(ctx, rt, caller, tool, params)
            args = calls.parse_args(params.arguments)
            if isinstance(args, str):
                return _error(args)
            run_id = await calls.start_run(rt, caller, params.name, args)
        except (TreadleError, ApiError) as exc:
            return _error(str(getattr(exc, "detail", None) or exc))
        return await self._drive(ctx, rt, caller, tool, run_id, 0)

    async def _resumed(
        self, ctx: Any, rt: Runtime, caller: Caller, tool: types.Tool, params: Any
    ) -> types.CallToolResult | types.InputRequiredResult:
        """A 2026-07-28 client's retry with the person's answer (``input_responses``)."""
        state = calls.parse_state(params.request_state or "")
        if state is None:
            raise MCPError(types.INVALID_PARAMS, "unknown request_state")
        record = await run_in_threadpool(calls.record_of, rt, caller.tenant, state[0])
        if record is None:
            raise MCPError(types.INVALID_PARAMS, "unknown request_state")
        answer = (params.input_responses or {}).get("pause")
        current = calls.state_of(record, state[2]) == params.request_state
        answered = isinstance(answer, types.ElicitResult) and current
        if answered and not await calls.resume(rt, caller, record, answer):
            return await calls.paused_result(rt, record)
        return await self._drive(ctx, rt, caller, tool, record.run.id, state[2])

    async def _drive(
        self, ctx: Any, rt: Runtime, caller: Caller, tool: types.Tool, run_id: str, cursor: int
    ) -> types.CallToolResult | types.InputRequiredResult:
        """Follow the run; ask the person when it pauses and the client can be asked. The
        call cancelled: the run is cancelled too."""
        wait = rt.settings.call_wait_s
        try:
            while True:
                at = await calls.follow_run(rt, ctx.session, run_id, caller.tenant, cursor, wait)
                cursor = at.cursor
                if at.state == "ended":
                    return calls.ended_result(at.record, tool.output_schema is not None)
                if at.state == "running":
                    return calls.handle_result(at.record)
                if not calls.can_elicit(ctx.session):
                    return await calls.paused_result(rt, at.record)
                form = calls.elicitation(at.record)
                if calls.modern(ctx.protocol_version):
                    ask = types.ElicitRequest(params=form)
                    state = calls.state_of(at.record, cursor)
                    return types.InputRequiredResult(
                        input_requests={"pause": ask}, request_state=state
                    )
                answer = await ctx.session.elicit_form(
                    form.message, form.requested_schema, related_request_id=ctx.request_id
                )
                if not await calls.resume(rt, caller, at.record, answer):
                    return await calls.paused_result(rt, at.record)
        except anyio.get_cancelled_exc_class():
            await calls.cancel_quietly(rt, caller.tenant, run_id)
            raise

    # --- resources: each run ------------------------------------------------------------

    async def _list_resources(
        self, ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[])  # runs are read by their URI

    async def _list_templates(
        self, ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        template = types.ResourceTemplate(
            name="run",
            uri_template=RUN_TEMPLATE,
            description="A treadle run: its status, pause and result",
            mime_type="application/json",
        )
        return types.ListResourceTemplatesResult(resource_templates=[template])

    async def _read_resource(
        self, ctx: Any, params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        rt, caller = _who(ctx)
        record = await self._own_run(rt, caller, str(params.uri))
        text = run_view(record).model_dump_json()
        contents = types.TextResourceContents(
            uri=str(params.uri), mime_type="application/json", text=text
        )
        return types.ReadResourceResult(contents=[contents])

    async def _own_run(self, rt: Runtime, caller: Caller, uri: str) -> Any:
        run_id = uri.removeprefix(calls.RUN_URI) if uri.startswith(calls.RUN_URI) else ""
        record = await run_in_threadpool(calls.record_of, rt, caller.tenant, run_id[:64])
        if not run_id or record is None or not caller.allows(keys.READ):
            raise MCPError(types.INVALID_PARAMS, f"resource {uri[:200]!r} not found")
        return record

    # --- subscriptions: an update each time the run moves -------------------------------

    async def _watch(
        self, rt: Runtime, run_id: str, cursor: int, notify: Callable[[], Awaitable[None]]
    ) -> None:
        """``notify`` after each batch of the run's events from ``cursor``, until it ends."""
        async for item in follow(rt, run_id, cursor, ends=TERMINAL, live=False, heartbeat=30):
            if isinstance(item, Batch):
                await notify()
                if item.last:
                    return

    async def _subscribe(self, ctx: Any, params: types.SubscribeRequestParams) -> types.EmptyResult:
        """A 2025 session: updates go out on its stream until the run ends or it
        unsubscribes."""
        rt, caller = _who(ctx)
        uri = str(params.uri)
        record = await self._own_run(rt, caller, uri)
        key = (id(ctx.session._connection), uri)  # noqa: SLF001 - the session's identity
        if key in self._watches or self._tasks is None:
            return types.EmptyResult()
        session = ctx.session
        scope = anyio.CancelScope()
        self._watches[key] = scope

        async def watch() -> None:
            with scope:
                try:
                    notify = lambda: session.send_resource_updated(uri)  # noqa: E731
                    await self._watch(rt, record.run.id, record.run.event_seq, notify)
                except Exception:  # the session went away: stop watching
                    pass
            self._watches.pop(key, None)

        self._tasks.start_soon(watch)
        return types.EmptyResult()

    async def _unsubscribe(
        self, ctx: Any, params: types.UnsubscribeRequestParams
    ) -> types.EmptyResult:
        key = (id(ctx.session._connection), str(params.uri))  # noqa: SLF001
        scope = self._watches.pop(key, None)
        if scope is not None:
            scope.cancel()
        return types.EmptyResult()

    async def _listen(
        self, ctx: Any, params: types.SubscriptionsListenRequestParams
    ) -> types.SubscriptionsListenResult:
        """2026-07-28: the listen stream is the request's own; each of the caller's runs it
        names is watched while it is open (a private bus: no other caller hears of them)."""
        rt, caller = _who(ctx)
        bus = InMemorySubscriptionBus()
        handler = ListenHandler(bus, max_subscriptions=1)
        uris = params.notifications.resource_subscriptions or []
        async with anyio.create_task_group() as tg:
            for uri in uris[:100]:
                try:
                    record = await self._own_run(rt, caller, uri)
                except MCPError:
                    continue  # honoured, never fires (as for any unknown URI)

                async def notify(uri: str = uri) -> None:
                    await bus.publish(ResourceUpdated(uri=uri))

                tg.start_soon(self._watch, rt, record.run.id, record.run.event_seq, notify)
            try:
                done = await handler(ctx, params)
            finally:
                tg.cancel_scope.cancel()
        return done


def _error(message: str) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=message)], is_error=True
    )
