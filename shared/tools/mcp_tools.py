"""MCP tools: the tools of the MCP servers an agent spec lists (``mcp:``), through the
official ``mcp`` SDK.

Transports: streamable HTTP and SSE for any spec; stdio (a local process) only for
operator-registered agents (the API refuses ``command`` in a submitted spec). HTTP servers go
through the SSRF guard: the host is checked once per connection and every request of it is
sent to that checked address (``netguard.pinned_address``), with the real name in ``Host``
and for TLS; a response body or SSE event over ``max_bytes`` ends the exchange.

The tool list of a server is fetched per process and cached ``ttl`` seconds (a failed fetch
for a short while, so a dead server is not asked again every round; a stale list serves while
the server is down). Each call opens its own session (connect, call, close) on the process's
event loop thread (``shared.tools.aioloop``), bounded by the server's ``timeout_s`` and the
run's deadline, and carries the call's ``Idempotency-Key`` (``<run_id>:<call_id>``) in
``_meta``. A failure of any kind (unreachable server, protocol error, the tool's own
``isError``) is a ``ToolError``: the call's result, never a failed run.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
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

from shared.agent.spec import McpServerSpec
from shared.errors import ToolError
from shared.tools.aioloop import LoopTimeout, run_async
from shared.tools.base import InvalidToolArguments, ToolContext, ToolResult
from shared.tools.netguard import pinned_address, tls_server_name

__all__ = [
    "IDEMPOTENCY_META",
    "McpAccess",
    "McpListing",
    "McpServer",
    "McpTool",
    "RemoteTool",
    "clear_tool_lists",
    "list_mcp_tools",
]

log = logging.getLogger("treadle.mcp")
T = TypeVar("T")
IDEMPOTENCY_META = "Idempotency-Key"
MAX_TOOLS_PER_SERVER = 256
MAX_SCHEMA_BYTES = 32_000
MAX_DESCRIPTION_CHARS = 2_000
_MAX_PAGES = 20
_FAILURE_TTL = 15.0  # a failed listing is not retried sooner than this (nor later than ttl)
_GRACE = 5.0  # the loop's own limit, past the session's: it cancels a session that hangs
_STALE_FOR = 24 * 3600.0  # a list that could not be refreshed serves this long
_CLIENT_INFO = mcp_types.Implementation(name="treadle", version="0.1.0")
_NAME_OK = re.compile(r"[^A-Za-z0-9_-]")


@dataclass(frozen=True, slots=True)
class McpAccess:
    """What reaching MCP servers takes in this process (from the settings)."""

    allow_hosts: tuple[str, ...] = ()
    ttl: float = 300.0
    max_bytes: int = 1_000_000


@dataclass(frozen=True, slots=True)
class RemoteTool:
    """One tool as the server lists it."""

    name: str
    description: str
    parameters: dict[str, Any]
    read_only_hint: bool = False


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

    def list_tools(self, environ: Mapping[str, str]) -> list[RemoteTool]:
        """Every tool the server lists (at most ``MAX_TOOLS_PER_SERVER``); ToolError."""
        return self._run(_list, environ, self.spec.timeout_s)

    def call(
        self, tool: str, args: dict[str, Any], ctx: ToolContext, timeout: float
    ) -> mcp_types.CallToolResult:
        meta = cast(mcp_types.RequestParamsMeta, {IDEMPOTENCY_META: ctx.idempotency_key})
        return self._run(lambda c: c.call_tool(tool, args, meta=meta), ctx.environ, timeout)

    def _run(
        self, op: Callable[[Client], Awaitable[T]], environ: Mapping[str, str], timeout: float
    ) -> T:
        try:
            make_transport = self._transport(environ, timeout)  # the SSRF check, here
        except ToolError as exc:
            raise ToolError(f"MCP server {self.name!r}: {exc}") from None

        async def session() -> T:
            with anyio.fail_after(timeout):
                client = Client(
                    make_transport(), read_timeout_seconds=timeout, client_info=_CLIENT_INFO
                )
                async with client:
                    return await op(client)

        try:
            return run_async(session, timeout + _GRACE)
        except LoopTimeout:
            raise ToolError(f"MCP server {self.name!r}: timed out after {timeout:g}s") from None
        except BaseException as exc:  # anyio wraps failures in exception groups
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            reason = _reason(exc, timeout)
            raise ToolError(f"MCP server {self.name!r}: {reason}") from None

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


async def _list(client: Client) -> list[RemoteTool]:
    found: list[RemoteTool] = []
    cursor: str | None = None
    for _ in range(_MAX_PAGES):
        page = await client.list_tools(cursor=cursor)
        found += [_remote(t) for t in page.tools]
        cursor = page.next_cursor
        if cursor is None or len(found) >= MAX_TOOLS_PER_SERVER:
            break
    return found[:MAX_TOOLS_PER_SERVER]


def _remote(tool: mcp_types.Tool) -> RemoteTool:
    hint = tool.annotations.read_only_hint if tool.annotations is not None else None
    return RemoteTool(
        name=tool.name,
        description=(tool.description or tool.title or "")[:MAX_DESCRIPTION_CHARS],
        parameters=dict(tool.input_schema),
        read_only_hint=bool(hint),
    )


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


# --- the tool list cache ------------------------------------------------------------------------


@dataclass
class _Listed:
    tools: list[RemoteTool] | None
    fetched_at: float
    fresh_until: float
    error: str = ""


class _ToolLists:
    """Tool lists by server identity: fresh for ``ttl``, a failure for a short while; a list
    that cannot be refreshed serves stale (a day at most)."""

    def __init__(self) -> None:
        self._lists: dict[tuple[Any, ...], _Listed] = {}
        self._lock = threading.Lock()

    def get(self, server: McpServer, environ: Mapping[str, str]) -> list[RemoteTool]:
        key = server.key(environ)
        now = time.monotonic()
        with self._lock:
            known = self._lists.get(key)
        if known is not None and now < known.fresh_until:
            return _or_raise(known)
        try:
            tools = server.list_tools(environ)
        except ToolError as exc:
            return self._failed(key, known, str(exc), now, server.access.ttl)
        with self._lock:
            self._lists[key] = _Listed(tools, now, now + server.access.ttl)
        return tools

    def _failed(
        self, key: tuple[Any, ...], known: _Listed | None, error: str, now: float, ttl: float
    ) -> list[RemoteTool]:
        retry_at = now + min(ttl, _FAILURE_TTL)
        stale = (
            known is not None and known.tools is not None and now - known.fetched_at < _STALE_FOR
        )
        if stale and known is not None:
            log.warning("MCP tool list refresh failed (serving the last list): %s", error)
            entry = _Listed(known.tools, known.fetched_at, retry_at)
        else:
            entry = _Listed(None, now, retry_at, error)
        with self._lock:
            self._lists[key] = entry
        return _or_raise(entry)

    def clear(self) -> None:
        with self._lock:
            self._lists.clear()


def _or_raise(listed: _Listed) -> list[RemoteTool]:
    if listed.tools is None:
        raise ToolError(listed.error)
    return listed.tools


_TOOL_LISTS = _ToolLists()


def clear_tool_lists() -> None:
    """Forget every cached tool list (tests)."""
    _TOOL_LISTS.clear()


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
        timeout = ctx.time_left(self.server.spec.timeout_s)
        result = self.server.call(self.remote, args, ctx, timeout)
        text = _result_text(result)
        if result.is_error:
            raise ToolError(text or "the tool reported an error")
        data: dict[str, Any] = {"mcp_server": self.server.name}
        if result.structured_content is not None:
            data["structured"] = result.structured_content
        return ToolResult(text=text or "(empty result)", data=data)


def _result_text(result: mcp_types.CallToolResult) -> str:
    parts = [_block_text(b) for b in result.content]
    if not any(parts) and result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False)
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


def list_mcp_tools(
    specs: Sequence[McpServerSpec],
    access: McpAccess,
    taken: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
) -> McpListing:
    """The tools of ``specs``' servers, as the model sees them: the server's name (made of
    ``[A-Za-z0-9_-]``), or ``<server>__<name>`` for a name that occurs more than once among
    them and ``taken`` (the spec's other tools) — the same names on every worker for the same
    lists. ``allow`` filters; ``read_only`` and ``readOnlyHint`` make reads."""
    env = os.environ if environ is None else environ
    out = McpListing()
    listed: list[tuple[McpServer, RemoteTool]] = []
    for spec in specs:
        server = McpServer(spec, access)
        try:
            found = _TOOL_LISTS.get(server, env)
        except ToolError as exc:
            out.unreachable[spec.name] = str(exc)
            out.warnings.append(f"MCP server {spec.name!r} could not be listed: {exc}")
            continue
        listed += [(server, t) for t in _allowed(spec, found, out.warnings)]
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
    return out


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
