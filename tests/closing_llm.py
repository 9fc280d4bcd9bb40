"""A fake OpenAI-compatible chat server whose bodies end by closing the connection.

``shared.llm.fake_server.FakeLLMServer`` runs under uvicorn, which frames every HTTP/1.1 body
(``Content-Length`` or chunked): a cut there is a broken chunked body the client sees as an
error. Some servers (HTTP/1.0-style ones, a few proxies) instead send no framing at all and
end the body by closing the connection; a server that dies mid-stream then looks to the
client like a stream that simply ended. This server answers that way, over a plain socket.

It is as strict as the uvicorn fake and programmed the same way: it holds a ``FakeState``
(the queue, the responder, the recorded requests, OpenAI's transcript check) and frames the
same SSE events (``sse_events``). ``ReplySpec.cut_after=N``: N data events, then the
connection closes cleanly (no ``[DONE]``, no ``finish_reason``) — the server died.
"""

from __future__ import annotations

import json
import socket
import socketserver
import threading
from types import TracebackType
from typing import Any

from shared.llm.fake_server import (
    TOOLS_REJECTED_BODY,
    FakeState,
    RecordedRequest,
    ReplySpec,
    SpecLike,
    completion_body,
    sse_events,
)
from tests.loopback import LoopbackTCPServer

__all__ = ["ClosingLLMServer"]

_MAX_HEAD = 64 * 1024
_STREAM_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"


def _read_request(rfile: Any) -> tuple[str, dict[str, str], bytes] | None:
    line = rfile.readline(_MAX_HEAD).decode("latin-1").strip()
    if not line:
        return None
    headers: dict[str, str] = {}
    while (h := rfile.readline(_MAX_HEAD).decode("latin-1").strip()) != "":
        name, _, value = h.partition(":")
        headers[name.strip().lower()] = value.strip()
    body = rfile.read(int(headers.get("content-length", "0")))
    return line.split(" ")[1], headers, body


def _json_reply(status: int, payload: Any) -> bytes:
    data = json.dumps(payload).encode()
    head = (
        f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + data


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        got = _read_request(self.rfile)
        if got is None:
            return
        path, headers, raw = got
        if not path.endswith("/chat/completions"):
            self.wfile.write(_json_reply(404, {"error": {"message": "not found"}}))
            return
        try:
            body = json.loads(raw)
        except ValueError:
            self.wfile.write(_json_reply(400, {"error": {"message": "body is not JSON"}}))
            return
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            self.wfile.write(_json_reply(400, {"error": {"message": "`messages` is required"}}))
            return
        state = self.server.state
        state.record(RecordedRequest(path, body, headers))
        refused = state.check(body)
        if refused is not None:
            self.wfile.write(_json_reply(400, refused))
            return
        self._serve(state, state.next_spec(body), body)

    def _serve(self, state: FakeState, spec: ReplySpec, body: dict[str, Any]) -> None:
        tools = bool(body.get("tools") or body.get("functions"))
        if (state.reject_tools or spec.reject_tools) and tools:
            self.wfile.write(_json_reply(400, TOOLS_REJECTED_BODY))
        elif spec.status != 200:
            err = {"error": {"message": f"fake error {spec.status}"}}
            self.wfile.write(_json_reply(spec.status, spec.body or err))
        elif spec.stream is False or not body.get("stream"):
            self.wfile.write(_json_reply(200, completion_body(spec, body)))
        else:  # no Content-Length, not chunked: the body ends when the connection closes
            head = (
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
            )
            self.wfile.write(head + b"".join(sse_events(spec, body)))
        self.wfile.flush()
        self.connection.shutdown(socket.SHUT_WR)


class _Server(LoopbackTCPServer):
    def __init__(self, state: FakeState) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.state = state


class ClosingLLMServer:
    """The server on a free local port, in a background thread (a context manager)."""

    def __init__(self, *, strict: bool = True) -> None:
        self.state = FakeState(strict=strict)
        self._server = _Server(self.state)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="closing-llm", daemon=True
        )

    def __enter__(self) -> ClosingLLMServer:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
        if exc_type is None and self.state.violations:
            raise AssertionError(f"requests a strict provider refuses: {self.state.violations}")

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def script(self, *specs: SpecLike) -> None:
        self.state.script(*specs)

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [r.body for r in self.state.requests]
