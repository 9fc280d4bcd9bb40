"""The tests' threaded HTTP servers: a listen backlog the size a real server has.

``ThreadingHTTPServer`` listens with a backlog of 5, so a burst of concurrent connections
(a fleet of workers calling one tool at once) overflows it and the kernel resets the excess
ones, which a test then reads as a fault of the code under test. Real servers listen with
hundreds (uvicorn 2048, nginx 511)."""

from __future__ import annotations

import socketserver
from http.server import ThreadingHTTPServer


class LoopbackServer(ThreadingHTTPServer):
    request_queue_size = 1024
    daemon_threads = True


class LoopbackTCPServer(socketserver.ThreadingTCPServer):
    """A threaded TCP server (a proxy, a hand-written HTTP endpoint) with the same backlog."""

    request_queue_size = 1024
    daemon_threads = True
    allow_reuse_address = True
