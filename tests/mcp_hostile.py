"""A hostile MCP server for tests: it speaks just enough of streamable HTTP (JSON responses to
JSON-RPC POSTs) to be listed and called, and misbehaves on request — a huge tool list, schemas
nested deep, results of many megabytes, answers that take a minute. Served on 127.0.0.1 by
uvicorn in a thread (``with HostileMcp(tools=1000) as server: server.url``).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
import uvicorn
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

__all__ = ["HostileMcp", "Misbehaviour"]


@dataclass
class Misbehaviour:
    tools: int = 3  # tools listed
    depth: int = 0  # nesting of each tool's input schema
    description_bytes: int = 0  # of each tool's description
    list_delay: float = 0.0  # seconds before tools/list answers
    call_delay: float = 0.0  # seconds before tools/call answers
    result_bytes: int = 10  # text of a call's result
    structured_depth: int = 0  # nesting of a call's structuredContent (0: none)


def _nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def _deep_value(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


@dataclass
class _State:
    how: Misbehaviour
    requests: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, method: str) -> None:
        with self.lock:
            self.requests[method] = self.requests.get(method, 0) + 1


class _App:
    def __init__(self, state: _State) -> None:
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        if request.method != "POST":
            await Response(status_code=405)(scope, receive, send)
            return
        body = json.loads(await request.body())
        response = await self._answer(body)
        await response(scope, receive, send)

    async def _answer(self, body: dict[str, Any]) -> Response:
        method, how = str(body.get("method")), self.state.how
        self.state.count(method)
        if "id" not in body:  # a notification
            return Response(status_code=202)
        if method == "initialize":
            version = (body.get("params") or {}).get("protocolVersion")
            result: dict[str, Any] = {
                "protocolVersion": version,
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "hostile", "version": "1"},
            }
        elif method == "tools/list":
            await anyio.sleep(how.list_delay)
            result = {"tools": [self._tool(i) for i in range(how.tools)]}
        elif method == "tools/call":
            await anyio.sleep(how.call_delay)
            result = {"content": [{"type": "text", "text": "x" * how.result_bytes}]}
            if how.structured_depth:
                result["structuredContent"] = _deep_value(how.structured_depth)
        else:
            result = {}
        return JSONResponse({"jsonrpc": "2.0", "id": body["id"], "result": result})

    def _tool(self, i: int) -> dict[str, Any]:
        how = self.state.how
        schema = {"type": "object", "properties": {"q": _nested(how.depth)}}
        return {
            "name": f"tool_{i}",
            "description": "d" * how.description_bytes or f"tool number {i}",
            "inputSchema": schema,
            "annotations": {"readOnlyHint": True},
        }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class HostileMcp:
    """``with HostileMcp(tools=1000, list_delay=60) as server:`` serves on ``server.url``."""

    def __init__(self, **how: Any) -> None:
        self.state = _State(Misbehaviour(**how))
        self.port = _free_port()
        config = uvicorn.Config(
            _App(self.state),
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            timeout_graceful_shutdown=1,
        )
        self._uvicorn = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._uvicorn.run, daemon=True)

    @property
    def how(self) -> Misbehaviour:
        return self.state.how

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def requests(self, method: str) -> int:
        with self.state.lock:
            return self.state.requests.get(method, 0)

    def __enter__(self) -> HostileMcp:
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._uvicorn.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the hostile MCP server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self._uvicorn.should_exit = True
        self._thread.join(5)
