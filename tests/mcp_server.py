"""A real MCP server for tests: the ``mcp`` package's own ``MCPServer`` (FastMCP in mcp 1.x),
served over streamable HTTP or SSE on 127.0.0.1 by uvicorn in a thread, or over stdio
(``python -m tests.mcp_server``).

Tools: ``lookup`` (annotated read-only), ``book`` (a write: like a well-behaved API it applies
each ``Idempotency-Key`` from ``_meta`` once and replays its answer), ``tally`` (a write the
spec may declare read-only), ``fail`` (``isError``), ``big`` (a large result), ``slow``,
``steps`` (progress notifications).
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

__all__ = ["McpTestServer", "make_server", "serving"]


class Effects:
    """What the write tool saw: requests and applied effects per idempotency key."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.hits: dict[str, int] = {}
        self.effects: dict[str, int] = {}
        self.answers: dict[str, str] = {}
        self.received = threading.Event()
        self.lock = threading.Lock()


def make_server(effects: Effects, name: str = "bookings") -> MCPServer:
    server: MCPServer = MCPServer(name, log_level="WARNING")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def lookup(city: str) -> str:
        """Look up the weather of a city."""
        return f"{city}: 21C, sunny"

    @server.tool()
    async def book(room: str, ctx: Context) -> str:
        """Book a meeting room."""
        meta: Any = ctx.request_context.meta or {}
        key = str(meta.get("Idempotency-Key") or "(none)")
        with effects.lock:
            effects.hits[key] = effects.hits.get(key, 0) + 1
        effects.received.set()
        if effects.delay:
            await anyio.sleep(effects.delay)
        with effects.lock:
            if key not in effects.answers:
                effects.effects[key] = effects.effects.get(key, 0) + 1
                effects.answers[key] = f"booked {room}"
            return effects.answers[key]

    @server.tool()
    def tally(item: str) -> str:
        """Count an item (declared read-only by the spec in some tests)."""
        return f"counted {item}"

    @server.tool()
    def fail() -> str:
        """Always fails."""
        raise ToolError("the booking system is closed")

    @server.tool()
    def big(size: int) -> str:
        """A large result."""
        return "x" * size

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def steps(count: int, ctx: Context) -> str:
        """Report progress ``count`` times (MCP progress notifications), then answer."""
        for i in range(1, count + 1):
            await ctx.report_progress(i, count, f"step {i} of {count}")
            await anyio.sleep(0.02)
        return f"did {count} steps"

    @server.tool()
    async def slow(seconds: float) -> str:
        """Sleep, then answer."""
        await anyio.sleep(seconds)
        return "slept"

    return server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class McpTestServer:
    """``with McpTestServer() as mcp:`` serves on ``mcp.url`` until the block ends."""

    def __init__(self, transport: str = "streamable_http", delay: float = 0.0) -> None:
        self.transport = transport
        self.effects = Effects(delay)
        self.port = _free_port()
        server = make_server(self.effects)
        app = server.sse_app() if transport == "sse" else server.streamable_http_app()
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        self._uvicorn = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._uvicorn.run, daemon=True)

    @property
    def url(self) -> str:
        path = "/sse" if self.transport == "sse" else "/mcp"
        return f"http://127.0.0.1:{self.port}{path}"

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> McpTestServer:
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._uvicorn.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the MCP test server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self._uvicorn.should_exit = True
        self._thread.join(10)


@contextmanager
def serving(transport: str = "streamable_http", delay: float = 0.0) -> Iterator[McpTestServer]:
    with McpTestServer(transport, delay) as server:
        yield server


if __name__ == "__main__":  # stdio
    make_server(Effects(), sys.argv[1] if len(sys.argv) > 1 else "local").run()
