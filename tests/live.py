"""Helpers for live tests: the API under a real uvicorn server in a thread, a pump that drives
the stub broker's messages as they come (like a worker), and an SSE reader."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import uvicorn

from scheduler.app import create_app
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker

__all__ = ["ApiServer", "Frame", "Pump", "read_sse"]


class ApiServer:
    """``create_app(lambda: rt)`` served by uvicorn on a free 127.0.0.1 port."""

    def __init__(self, rt: Runtime) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        config = uvicorn.Config(
            create_app(lambda: rt),
            log_config=None,
            log_level="warning",
            lifespan="off",
            access_log=False,
            timeout_graceful_shutdown=1,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True, name="api"
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def __enter__(self) -> ApiServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the API server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


class Pump:
    """Deliver the stub broker's messages as they are published, on ``threads`` threads."""

    def __init__(self, rt: Runtime, stub: StubBroker, threads: int = 2) -> None:
        self.rt, self.stub = rt, stub
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._loop, daemon=True, name=f"pump-{i}")
            for i in range(threads)
        ]

    def _loop(self) -> None:
        while not self._stop.is_set():
            item = self.stub.pop()
            if item is None:
                time.sleep(0.002)
                continue
            self.stub.deliver(self.rt, item)

    def __enter__(self) -> Pump:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)


@dataclass(frozen=True)
class Frame:
    """One SSE frame as the client saw it; ``comment`` frames have no event."""

    event: str | None
    id: int | None
    data: Any
    comment: str | None
    at: float  # time.time() when the client had it


def _frames(lines: Iterator[str]) -> Iterator[Frame]:
    import json

    fields: dict[str, str] = {}
    for line in lines:
        if line.startswith(":"):
            yield Frame(None, None, None, line[1:].strip(), time.time())
        elif line == "":
            if "event" in fields or "data" in fields:
                yield Frame(
                    fields.get("event", "message"),
                    int(fields["id"]) if "id" in fields else None,
                    json.loads(fields.get("data", "null")),
                    None,
                    time.time(),
                )
            fields = {}
        else:
            key, _, value = line.partition(":")
            fields[key] = value[1:] if value.startswith(" ") else value


def read_sse(
    url: str,
    *,
    last_event_id: int | None = None,
    stop: Callable[[list[Frame]], bool] | None = None,
    timeout: float = 30.0,
) -> tuple[list[Frame], int]:
    """Read frames until the server ends the stream or ``stop(frames)`` (then disconnect).
    Returns (frames, HTTP status)."""
    headers = {"Last-Event-ID": str(last_event_id)} if last_event_id is not None else {}
    out: list[Frame] = []
    with httpx.stream(
        "GET", url, headers=headers, timeout=httpx.Timeout(10.0, read=timeout)
    ) as resp:
        if resp.status_code != 200:
            return out, resp.status_code
        for frame in _frames(resp.iter_lines()):
            out.append(frame)
            if stop is not None and stop(out):
                break
    return out, 200
