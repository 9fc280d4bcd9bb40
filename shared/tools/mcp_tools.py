"""MCP tools: the tools of the MCP servers an agent spec lists (``mcp:``), through the
official ``mcp`` SDK.

Transports: streamable HTTP and SSE for any spec; stdio (a local process) only for
operator-registered agents (the API refuses ``command`` in a submitted spec). HTTP servers go
through the SSRF guard: the host is checked once per connection and every request of it is
sent to that checked address (``netguard.pinned_address``), with the real name in ``Host``
and for TLS; a response body or SSE event over ``max_bytes`` ends the exchange.

Bounded like every other input: a server's list keeps at most ``max_tools`` tools and
``list_bytes`` bytes of names, descriptions and schemas (the rest is left out, with a warning),
a schema over ``MAX_SCHEMA_BYTES`` or nested deeper than ``MAX_DEPTH`` leaves its tool out, and
the run's catalog as a whole holds at most ``max_tools`` tools (``TREADLE_MAX_TOOLS``: the spec's
own first). A result's structured content deeper than ``MAX_DEPTH`` or over
``MAX_STRUCTURED_BYTES`` is dropped (its text stays). Every exchange has the wall limit
``min(timeout_s, TREADLE_MCP_TIMEOUT_S)`` and the run's deadline.

The tool lists are cached per process in a byte-bounded ``ToolLists`` the runtime holds
(``shared.tools.mcp_lists``): listings run on the process's event loop thread
(``shared.tools.aioloop``) and a round waits for them a bounded while. Each call opens its own
session (connect, call, close) on that loop, and carries the call's ``Idempotency-Key``
(``<run_id>:<call_id>``) in ``_meta``. A failure of any kind (unreachable server, protocol
error, the tool's own ``isError``) is a ``ToolError``: the call's result, never a failed run.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import anyio
import httpx2
import mcp_types
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.sse import sse_client
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from shared.agent.output import json_depth
from shared.agent.spec import McpServerSpec
from shared.errors import ToolError
from shared.tools.aioloop import LoopTimeout, run_async, submit
from shared.tools.base import InvalidToolArguments, ToolContext, ToolResult
from shared.tools.mcp_lists import Fetched, Job, Listing, RemoteTool, ToolLists
from shared.tools.netguard import pinned_address, tls_server_name

__all__ = [
    "IDEMPOTENCY_META",
    "MAX_DEPTH",
    "McpAccess",
    "McpListing",
    "McpServer",
    "McpTool",
    "RemoteTool",
    "ToolLists",
    "list_mcp_tools",
]

log = logging.getLogger("treadle.mcp")
T = TypeVar("T")
IDEMPOTENCY_META = "Idempotency-Key"
MAX_SCHEMA_BYTES = 32_000
MAX_DESCRIPTION_CHARS = 2_000
MAX_DEPTH = 32  # of a tool's input schema, and of a result's structured content
MAX_STRUCTURED_BYTES = 64_000  # a result's structured content kept with the call's data
_MAX_PAGES = 20
_GRACE = 5.0  # the loop's own limit, past the session's: it cancels a session that hangs
_CLIENT_INFO = mcp_types.Implementation(name="treadle", version="0.1.0")
_NAME_OK = re.compile(r"[^A-Za-z0-9_-]")


@dataclass(frozen=True, slots=True)
class McpAccess:
    """What reaching MCP servers takes in this process (from the settings), and for whom:
    ``tenant`` and its run's ``deadline`` (epoch seconds) bound the wait for a listing."""

    allow_hosts: tuple[str, ...] = ()
    ttl: float = 300.0
    max_bytes: int = 1_000_000  # one HTTP body or SSE event
    timeout_s: float = 30.0  # the operator's cap on a server's timeout_s
    max_tools: int = 64  # per server, and per run (the spec's own tools included)
    list_bytes: int = 256_000  # names, descriptions and schemas kept of one server's list
    wait_s: float = 10.0  # the longest a round waits for a listing
    tenant: str = "default"
    deadline: float | None = None

    def timeout(self, spec: McpServerSpec) -> float:
        """The wall limit of one exchange with the server (a tenant cannot raise it)."""
        return min(spec.timeout_s, self.timeout_s)

    def wait(self) -> float:
        """How long a round may wait for listings now: ``wait_s``, and half the time left
        before the deadline at most (the other half is the model's), 0 past it."""
        left = self.wait_s if self.deadline is None else (self.deadline - time.time()) / 2
        return max(0.0, min(self.wait_s, left))


# --- HTTP: pinned to the checked address, bounded ---------------------------------------------


class _Bounded(httpx2.AsyncByteStream):
    """A response body that fails once it passes ``limit`` bytes."""

    def __init__(self, inner: httpx2.AsyncByteStream, limit: int) -> None:
        self._inner, self._limit = inner, limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in self._inner:
            seen += len(chunk)
            if seen > self._limit:
                raise ToolError(f"response too large (limit {self._limit} bytes)")
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


@dataclass(frozen=True, slots=True)
class _Pin:
    """A URL's host and the address checked for it (resolved in the caller's thread: DNS
    blocks, and must not block the event loop)."""

    host: str
    address: str
    sni: str | None

    @classmethod
    def of(cls, url: str, allow_hosts: Sequence[str]) -> _Pin:
        address = pinned_address(url, allow_hosts)  # ToolError: blocked or unresolvable
        return cls(httpx2.URL(url).host, address, tls_server_name(url))


class _Pinned(httpx2.AsyncBaseTransport):
    """Sends every request for ``host`` to ``address`` (checked by the SSRF guard); refuses
    any other host. Responses are cut at ``limit`` bytes."""

    def __init__(self, pin: _Pin, limit: int) -> None:
        self._host, self._address, self._sni = pin.host, pin.address, pin.sni
        self._limit = limit
        self._inner = httpx2.AsyncHTTPTransport(trust_env=False)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if request.url.host != self._host:
            raise ToolError(f"refused a request to {request.url.host}: not the server's host")
        request.url = request.url.copy_with(host=self._address)
        if self._sni:
            request.extensions = {**request.extensions, "sni_hostname": self._sni}
        response = await self._inner.handle_async_request(request)
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self._limit:
            await response.aclose()
            raise ToolError(f"response too large (limit {self._limit} bytes)")
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        response.stream = _Bounded(response.stream, self._limit)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


# --- one server ---------------------------------------------------------------------------------


class McpServer:
    """How to reach one server of a spec: its transport, headers and limits."""

    def __init__(self, spec: McpServerSpec, access: McpAccess) -> None:
        self.spec, self.access = spec, access

    @property
    def name(self) -> str:
        return self.spec.name

    def key(self, environ: Mapping[str, str]) -> tuple[Any, ...]:
        """The identity of the server for the tool-list cache (what it lists may depend on
        the credentials sent: their values count, hashed)."""
        secrets = tuple(sorted((h, hash(environ.get(v))) for h, v in self.spec.headers_env.items()))
        target = self.spec.url or tuple(self.spec.command or ())
        env = tuple(sorted(self.spec.env.items()))
        return (self.spec.kind, target, secrets, env, self.access.allow_hosts)

    def start_listing(self, environ: Mapping[str, str]) -> concurrent.futures.Future[Fetched]:
        """The server's tools, fetched on the event loop (a future; ToolError inside). The
        SSRF check's DNS lookup runs in a helper thread of the loop, within the limit."""
        timeout, access = self.access.timeout(self.spec), self.access

        async def prepare() -> Callable[[], Any]:
            return await anyio.to_thread.run_sync(
                self._transport, environ, timeout, abandon_on_cancel=True
            )

        return submit(
            lambda: self._session(lambda c: _list(c, access), prepare, timeout),
            timeout + _GRACE,
        )

    def call(
        self, tool: str, args: dict[str, Any], ctx: ToolContext, timeout: float
    ) -> mcp_types.CallToolResult:
        meta = cast(mcp_types.RequestParamsMeta, {IDEMPOTENCY_META: ctx.idempotency_key})
        try:
            maker = self._transport(ctx.environ, timeout)  # the SSRF check, in this thread
        except ToolError as exc:
            raise ToolError(f"MCP server {self.name!r}: {exc}") from None

        async def prepare() -> Callable[[], Any]:
            return maker

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            ctx.progress(progress, total, message)  # the server's notifications/progress

        def session() -> Awaitable[mcp_types.CallToolResult]:
            return self._session(
                lambda c: c.call_tool(tool, args, progress_callback=on_progress, meta=meta),
                prepare,
                timeout,
            )

        try:
            return run_async(session, timeout + _GRACE)
        except LoopTimeout:
            raise ToolError(f"MCP server {self.name!r}: timed out after {timeout:g}s") from None

    async def _session(
        self,
        op: Callable[[Client], Awaitable[T]],
        prepare: Callable[[], Awaitable[Callable[[], Any]]],
        timeout: float,
    ) -> T:
        """One session within ``timeout``: the transport made (``prepare``), connect, ``op``,
        close. Any failure is a ToolError naming the server."""
        try:
            with anyio.fail_after(timeout):
                make_transport = await prepare()
                client = Client(
                    make_transport(), read_timeout_seconds=timeout, client_info=_CLIENT_INFO
                )
                async with client:
                    return await op(client)
        except BaseException as exc:  # anyio wraps failures in exception groups
            if _cancelled(exc) or isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            raise ToolError(f"MCP server {self.name!r}: {_reason(exc, timeout)}") from None

    def _transport(self, environ: Mapping[str, str], timeout: float) -> Callable[[], Any]:
        """A maker of the session's transport, to call on the loop; what can fail before
        connecting (a missing variable, a blocked URL) raises ToolError here."""
        spec = self.spec
        if spec.kind == "stdio":
            assert spec.command is not None
            env = {child: _env(environ, var, child) for child, var in spec.env.items()}
            params = StdioServerParameters(command=spec.command[0], args=spec.command[1:], env=env)
            return lambda: stdio_client(params)
        url = spec.url
        assert url is not None
        headers = {h: _env(environ, v, h) for h, v in spec.headers_env.items()}
        pin = _Pin.of(url, self.access.allow_hosts)
        limit = self.access.max_bytes
        if spec.kind == "sse":
            return lambda: _sse(url, headers, _Pinned(pin, limit), timeout)
        return lambda: _streamable(url, headers, _Pinned(pin, limit), timeout, limit)


def _http_client(headers: Mapping[str, str], pinned: _Pinned, timeout: float) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(
        headers=dict(headers),
        transport=pinned,
        timeout=httpx2.Timeout(timeout),
        trust_env=False,
        follow_redirects=False,
    )


@asynccontextmanager
async def _streamable(
    url: str, headers: Mapping[str, str], pinned: _Pinned, timeout: float, limit: int
) -> AsyncIterator[Any]:
    async with (
        _http_client(headers, pinned, timeout) as client,
        streamable_http_client(url, http_client=client, max_sse_event_size=limit) as streams,
    ):
        yield streams


def _sse(
    url: str, headers: Mapping[str, str], pinned: _Pinned, timeout: float
) -> AbstractAsyncContextManager[Any]:
    def factory(
        headers: dict[str, str] | None = None,
        timeout: httpx2.Timeout | None = None,
        auth: httpx2.Auth | None = None,
    ) -> httpx2.AsyncClient:
        return httpx2.AsyncClient(
            headers=headers, transport=pinned, timeout=timeout, trust_env=False
        )

    return sse_client(
        url,
        headers=dict(headers),
        timeout=timeout,
        sse_read_timeout=timeout,
        httpx_client_factory=factory,
    )


def _env(environ: Mapping[str, str], var: str, what: str) -> str:
    value = environ.get(var)
    if value is None:
        raise ToolError(f"environment variable {var} ({what}) is not set")
    return value


async def _list(client: Client, access: McpAccess) -> Fetched:
    """The server's tools, pages followed, within ``access``'s count and byte limits."""
    found: list[RemoteTool] = []
    size, note, cursor = 0, "", None
    for _ in range(_MAX_PAGES):
        page = await client.list_tools(cursor=cursor)
        for listed in page.tools:
            tool = _remote(listed)
            if len(found) >= access.max_tools:
                note = f"lists more than {access.max_tools} tools (TREADLE_MAX_TOOLS)"
            elif size + tool.size > access.list_bytes:
                note = f"lists over {access.list_bytes} bytes (TREADLE_MCP_LIST_MAX_BYTES)"
            else:
                found.append(tool)
                size += tool.size
                continue
            return Fetched(tuple(found), f"{note}: the first {len(found)} kept")
        cursor = page.next_cursor
        if cursor is None:
            break
    return Fetched(tuple(found), note)


def _remote(tool: mcp_types.Tool) -> RemoteTool:
    hint = tool.annotations.read_only_hint if tool.annotations is not None else None
    return RemoteTool(
        name=tool.name[:256],
        description=(tool.description or tool.title or "")[:MAX_DESCRIPTION_CHARS],
        parameters=dict(tool.input_schema),
        read_only_hint=bool(hint),
    )


def _cancelled(exc: BaseException) -> bool:
    """A cancellation (of the session by its caller's limit): to pass on, not to report."""
    import asyncio

    leaves = list(_leaves(exc))
    return bool(leaves) and all(isinstance(leaf, asyncio.CancelledError) for leaf in leaves)


def _reason(exc: BaseException, timeout: float) -> str:
    """The most telling message inside a (possibly grouped) failure."""
    leaves = list(_leaves(exc))
    if any(isinstance(leaf, TimeoutError | httpx2.TimeoutException) for leaf in leaves):
        return f"timed out after {timeout:g}s"
    for kinds in ((ToolError,), (MCPError,), (httpx2.HTTPError, OSError)):
        for leaf in leaves:
            if isinstance(leaf, kinds):
                return _describe(leaf)
    return _describe(leaves[0]) if leaves else type(exc).__name__


def _leaves(exc: BaseException) -> Iterable[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


def _describe(exc: BaseException) -> str:
    if isinstance(exc, httpx2.ConnectError | ConnectionError):
        return f"unreachable ({exc or type(exc).__name__})"
    if isinstance(exc, httpx2.HTTPStatusError):
        return f"HTTP {exc.response.status_code}"
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text and not isinstance(exc, ToolError) else text


# --- the tools ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class McpTool:
    """A tool of an MCP server, as the model sees it (``name``, maybe namespaced) and as the
    server knows it (``remote``)."""

    server: McpServer
    remote: str
    name: str
    description: str
    parameters: dict[str, Any]
    read_only: bool = False
    internal: bool = False

    def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        if not isinstance(args, dict):
            raise InvalidToolArguments(f"Invalid arguments for {self.name}: expected an object")
        timeout = ctx.time_left(self.server.access.timeout(self.server.spec))
        result = self.server.call(self.remote, args, ctx, timeout)
        text = _result_text(result)
        if result.is_error:
            raise ToolError(text or "the tool reported an error")
        data: dict[str, Any] = {"mcp_server": self.server.name}
        structured = result.structured_content
        if structured is not None:
            why = _unkept(structured)
            if why:
                data["structured_dropped"] = why
            else:
                data["structured"] = structured
        return ToolResult(text=text or "(empty result)", data=data)


def _unkept(structured: Any) -> str:
    """Why a result's structured content is not kept with the call ("" when it is)."""
    if json_depth(structured) > MAX_DEPTH:
        return f"nested deeper than {MAX_DEPTH} levels"
    size = len(json.dumps(structured, ensure_ascii=False))
    if size > MAX_STRUCTURED_BYTES:
        return f"{size} bytes, over {MAX_STRUCTURED_BYTES}"
    return ""


def _result_text(result: mcp_types.CallToolResult) -> str:
    parts = [_block_text(b) for b in result.content]
    structured = result.structured_content
    if not any(parts) and structured is not None:
        if json_depth(structured) > MAX_DEPTH:
            return f"(structured content nested deeper than {MAX_DEPTH} levels: not shown)"
        return json.dumps(structured, ensure_ascii=False)
    return "\n".join(p for p in parts if p)


def _block_text(block: mcp_types.ContentBlock) -> str:
    if isinstance(block, mcp_types.TextContent):
        return block.text
    if isinstance(block, mcp_types.ImageContent | mcp_types.AudioContent):
        return f"[{block.type}: {block.mime_type}]"
    if isinstance(block, mcp_types.EmbeddedResource):
        res = block.resource
        if isinstance(res, mcp_types.TextResourceContents):
            return res.text
        return f"[resource: {res.uri}]"
    return f"[resource: {block.uri}]"


@dataclass
class McpListing:
    """A spec's MCP tools: the tools, what was left out and why, and the servers that could
    not be listed (server name → reason)."""

    tools: list[McpTool] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    unreachable: dict[str, str] = field(default_factory=dict)
    deferred: bool = False  # a server is still listing, not waited for: ask again shortly


def list_mcp_tools(
    specs: Sequence[McpServerSpec],
    access: McpAccess,
    lists: ToolLists | None = None,
    *,
    taken: Iterable[str] = (),
    room: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> McpListing:
    """The tools of ``specs``' servers, as the model sees them: the server's name (made of
    ``[A-Za-z0-9_-]``), or ``<server>__<name>`` for a name that occurs more than once among
    them and ``taken`` (the spec's other tools) — the same names on every worker for the same
    lists. ``allow`` filters; ``read_only`` and ``readOnlyHint`` make reads. At most ``room``
    tools in all (default ``access.max_tools``). ``lists``: the process's cached lists (None:
    fetched now, not kept); servers are listed at once, waited for ``access.wait()``."""
    env = os.environ if environ is None else environ
    out = McpListing()
    servers = [McpServer(spec, access) for spec in specs]
    jobs = [Job(s.key(env), _starter(s, env), access.ttl) for s in servers]
    cache = lists if lists is not None else ToolLists()
    found = cache.find(jobs, access.tenant, access.wait())
    listed: list[tuple[McpServer, RemoteTool]] = []
    for server, listing in zip(servers, found, strict=True):
        listed += [(server, t) for t in _usable(server, listing, out)]
    _name_tools(listed, taken, out)
    _fit(out, access.max_tools if room is None else room)
    return out


def _starter(
    server: McpServer, environ: Mapping[str, str]
) -> Callable[[], concurrent.futures.Future[Fetched]]:
    return lambda: server.start_listing(environ)


def _usable(server: McpServer, listing: Listing, out: McpListing) -> list[RemoteTool]:
    """The tools of one server's listing that may go into the catalog; what is missing goes
    into ``out`` (its warnings, the unreachable servers)."""
    name = server.name
    out.deferred = out.deferred or listing.deferred
    if listing.tools is None:
        out.unreachable[name] = listing.error
        out.warnings.append(f"MCP server {name!r} could not be listed: {listing.error}")
        return []
    if listing.stale:
        log.warning(
            "MCP tool list of %r not refreshed (serving the last one): %s", name, listing.error
        )
    if listing.note:
        out.warnings.append(f"MCP server {name!r} {listing.note}")
    return _allowed(server.spec, list(listing.tools), out.warnings)


def _name_tools(
    listed: list[tuple[McpServer, RemoteTool]], taken: Iterable[str], out: McpListing
) -> None:
    taken = list(taken)
    counts: dict[str, int] = {}
    for name in [*taken, *(_plain(t.name) for _, t in listed)]:
        counts[name] = counts.get(name, 0) + 1
    seen = set(taken)
    for server, tool in listed:
        name = _plain(tool.name)
        if counts[name] > 1:
            name = f"{server.name}__{name}"[:64]
        if name in seen:
            out.warnings.append(f"MCP tool {tool.name!r} of {server.name!r}: name taken, left out")
            continue
        seen.add(name)
        out.tools.append(_tool(server, tool, name))


def _fit(out: McpListing, room: int) -> None:
    """At most ``room`` MCP tools: the run's tool limit counts them (the first ones kept)."""
    room = max(0, room)
    if len(out.tools) <= room:
        return
    left = [t.name for t in out.tools[room:]]
    del out.tools[room:]
    out.warnings.append(
        f"{len(left)} MCP tool(s) left out ({', '.join(left[:5])}"
        f"{', ...' if len(left) > 5 else ''}): a run has at most its tool limit "
        "(TREADLE_MAX_TOOLS), its spec's own tools first"
    )


def _allowed(spec: McpServerSpec, tools: list[RemoteTool], warnings: list[str]) -> list[RemoteTool]:
    if spec.allow is None:
        kept = tools
    else:
        kept = [t for t in tools if t.name in spec.allow]
        missing = sorted(set(spec.allow) - {t.name for t in tools})
        if missing:
            warnings.append(f"MCP server {spec.name!r} has no tool(s) {', '.join(missing)}")
    out = []
    for t in kept:
        if len(json.dumps(t.parameters)) > MAX_SCHEMA_BYTES:
            warnings.append(f"MCP tool {t.name!r} of {spec.name!r}: schema too large, left out")
        elif json_depth(t.parameters) > MAX_DEPTH:
            warnings.append(f"MCP tool {t.name!r} of {spec.name!r}: schema too deep, left out")
        else:
            out.append(t)
    return out


def _plain(name: str) -> str:
    return _NAME_OK.sub("_", name)[:64] or "_"


def _tool(server: McpServer, remote: RemoteTool, name: str) -> McpTool:
    params = dict(remote.parameters)
    params.setdefault("type", "object")
    params.setdefault("properties", {})
    read_only = remote.read_only_hint or remote.name in server.spec.read_only
    return McpTool(
        server=server,
        remote=remote.name,
        name=name,
        description=remote.description,
        parameters=params,
        read_only=read_only,
    )
