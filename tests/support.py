"""Shared test helpers: service URLs, real Celery worker processes, waiting on runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
KIT = ROOT.parent / "shared"  # the team kit beside the repo (fixtures)
IN_CI = bool(os.environ.get("CI"))
PG_ADMIN = os.environ.get("TREADLE_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REDIS_BASE = os.environ.get("TREADLE_TEST_REDIS", "redis://127.0.0.1:6379")


def need_service(name: str, exc: BaseException) -> None:
    """In CI a missing service fails the run; locally the test skips with a message."""
    msg = f"{name} is not reachable ({type(exc).__name__}: {exc}); start it (see README)"
    if IN_CI:
        pytest.fail(msg)
    pytest.skip(msg)


def wait_for(
    pred: Callable[[], Any], timeout: float = 30.0, interval: float = 0.05, what: str = "condition"
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


class WorkerProcs:
    """Real ``celery worker`` processes (threads pool), each in its own process group."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env = env
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(
        self,
        name: str | None = None,
        concurrency: int = 8,
        queues: str = "treadle.rounds,treadle.tools,treadle.webhooks",
    ) -> str:
        name = name or f"w{len(self.procs) + 1}-{uuid.uuid4().hex[:4]}"
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        cmd = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "worker.app",
            "worker",
            "-P",
            "threads",
            "-c",
            str(concurrency),
            "--without-mingle",
            "--without-gossip",
            "-Q",
            queues,
            "-n",
            f"{name}@%h",
            "--loglevel=INFO",
        ]
        self.procs[name] = subprocess.Popen(
            cmd,
            env={**os.environ, **self.env},
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for(
            lambda: b"ready" in (self.log_dir / f"{name}.log").read_bytes(),
            30,
            what=f"worker {name} ready",
        )
        return name

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.pop(name)
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.kill(name, signal.SIGKILL)

    def log(self, name: str) -> str:
        return (self.log_dir / f"{name}.log").read_text(errors="replace")


def model_calls(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


class EffectServer:
    """A write endpoint that, like a well-behaved API, applies each Idempotency-Key once and
    replays the stored response for repeats. ``effects[key]`` counts applied effects (must be
    1); ``hits[key]`` counts requests (may be more after crashes)."""

    def __init__(self, delay: float = 0.0) -> None:
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.delay = delay
        self.effects: dict[str, int] = {}
        self.hits: dict[str, int] = {}
        self.responses: dict[str, bytes] = {}
        self.received = threading.Event()
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                key = self.headers.get("Idempotency-Key") or "(none)"
                with lock:
                    outer.hits[key] = outer.hits.get(key, 0) + 1
                outer.received.set()
                if outer.delay:
                    time.sleep(outer.delay)
                with lock:
                    if key not in outer.responses:
                        outer.effects[key] = outer.effects.get(key, 0) + 1
                        item = json.loads(body or b"{}").get("item")
                        outer.responses[key] = json.dumps({"recorded": item}).encode()
                    payload = outer.responses[key]
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> EffectServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
