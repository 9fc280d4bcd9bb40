"""A local webhook receiver for tests: records every POST, answers from a script of statuses
(then 200), can hang before answering."""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.loopback import LoopbackServer

__all__ = ["Received", "Receiver", "closed_port_url"]


@dataclass(frozen=True)
class Received:
    headers: dict[str, str]
    body: bytes
    at: float

    @property
    def json(self) -> Any:
        return json.loads(self.body)


class Receiver:
    def __init__(self, statuses: list[int] | None = None, hang: float = 0.0) -> None:
        self.statuses = list(statuses or [])
        self.hang = hang
        self.received: list[Received] = []
        self._lock = threading.Lock()
        self._server = LoopbackServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), daemon=True
        )

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                status = receiver._record(dict(self.headers.items()), body)
                if receiver.hang:
                    time.sleep(receiver.hang)
                self.send_response(status)
                self.send_header("content-type", "text/plain")
                self.end_headers()
                self.wfile.write(b"ok" if status < 300 else b"try again")

            def log_message(self, *args: Any) -> None:
                pass

        return Handler

    def _record(self, headers: dict[str, str], body: bytes) -> int:
        with self._lock:
            self.received.append(
                Received({k.lower(): v for k, v in headers.items()}, body, time.time())
            )
            return self.statuses.pop(0) if self.statuses else 200

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/hook"

    def start(self) -> Receiver:
        self._thread.start()
        return self

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def closed_port_url() -> str:
    """A URL on 127.0.0.1 where nothing listens (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/hook"
