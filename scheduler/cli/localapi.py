"""An in-process API server on a free loopback port (``treadle demo --interactive``).

Embedded mode as ``treadle up`` runs it (worker thread, reaper loop, SQLite), served by
uvicorn in a daemon thread, so the interactive demo drives the same HTTP API, through the
same client code, as any other client.
"""

from __future__ import annotations

import logging
import socket
import threading
import time

import uvicorn

__all__ = ["LocalApi"]


class LocalApi:
    """``with LocalApi() as api: ApiClient(api.url)``: embedded treadle on 127.0.0.1:<free>."""

    def __init__(self, concurrency: int = 4, *, quiet: bool = True) -> None:
        self.concurrency, self.quiet = concurrency, quiet
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.server: uvicorn.Server | None = None
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def start(self) -> LocalApi:
        from scheduler.app import create_app
        from scheduler.embedded import start_embedded
        from shared.wiring import get_runtime

        if self.quiet:  # the worker logs INFO to stderr; keep the person's terminal clean
            logging.disable(logging.WARNING)
        start_embedded(get_runtime(), self.concurrency)
        config = uvicorn.Config(
            create_app(),
            log_config=None,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=1,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run,
            kwargs={"sockets": [self.sock]},
            daemon=True,
            name="treadle-local-api",
        )
        self.thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the local API server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        if self.server is not None and self.thread is not None:
            self.server.should_exit = True
            self.thread.join(timeout=5)
        self.sock.close()

    def __enter__(self) -> LocalApi:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        self.stop()
