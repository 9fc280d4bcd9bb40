"""Real local HTTP(S) servers for the tool tests (threads, 127.0.0.1, ephemeral ports).

Paths: ``/status/<code>``, ``/redirect?to=<url>&code=<n>``, ``/loop``, ``/big?n=<bytes>``
(with Content-Length), ``/stream?n=<bytes>`` (chunked, no length), ``/slow?delay=<s>`` (a trickle),
``/events?n=<k>`` (an event stream: k progress frames, then the result), ``/binary``,
``/gzip``; anything else echoes the request as JSON.
"""

from __future__ import annotations

import gzip
import json
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.loopback import LoopbackServer

__all__ = ["Certs", "FakeDns", "LocalServer", "Recorded"]


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # lower-case names
    body: bytes
    peer_port: int = 0  # the client's port: one per connection

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class LocalServer:
    scheme: str
    port: int
    requests: list[Recorded] = field(default_factory=list)

    @property
    def host_port(self) -> str:
        return f"127.0.0.1:{self.port}"

    def url(self, path: str = "/", host: str = "127.0.0.1") -> str:
        return f"{self.scheme}://{host}:{self.port}{path}"


class _Server(LoopbackServer):
    record: LocalServer


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        return

    def do_GET(self) -> None:
        self._dispatch()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_GET

    def _dispatch(self) -> None:
        parts = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        seen = Recorded(
            method=self.command,
            path=parts.path,
            query=parse_qs(parts.query),
            headers={k.lower(): v for k, v in self.headers.items()},
            body=self.rfile.read(length) if length else b"",
            peer_port=int(self.client_address[1]),
        )
        self.server.record.requests.append(seen)
        try:
            self._route(seen)
        except OSError:
            self.close_connection = True  # the client went away (size or time cap): fine

    def _route(self, seen: Recorded) -> None:
        q = {k: v[0] for k, v in seen.query.items()}
        if seen.path.startswith("/status/"):
            code = int(seen.path.rsplit("/", 1)[1])
            self._send(code, f"error {code}: the detail\nsecond line".encode(), "text/plain")
        elif seen.path == "/redirect":
            self._redirect(int(q.get("code", "302")), q["to"])
        elif seen.path == "/loop":
            self._redirect(302, "/loop")
        elif seen.path == "/big":
            self._send(200, b"x" * int(q["n"]), "text/plain")
        elif seen.path == "/stream":
            self._chunked([b"y" * 1024] * (int(q["n"]) // 1024), delay=0.0)
        elif seen.path == "/slow":
            self._chunked([b"z"] * 100, delay=float(q.get("delay", "0.2")))
        elif seen.path == "/stop":
            self._send(
                200, b"done here", "text/plain", headers={"Treadle-Stop": q.get("value", "")}
            )
        elif seen.path == "/events":  # progress frames, then the result (an event stream)
            n = int(q.get("n", "5"))
            frames = [
                "event: progress\r\ndata: "
                + json.dumps({"progress": i, "total": n, "message": f"step {i}"})
                + "\r\n\r\n"
                for i in range(1, n + 1)
            ]
            frames.append("event: result\ndata: all\ndata: done\n\n")
            self._chunked([f.encode() for f in frames], delay=0.05, kind="text/event-stream")
        elif seen.path == "/binary":
            self._send(200, b"\x89PNG\r\n\x1a\n" + bytes(100), "image/png")
        elif seen.path == "/gzip":
            self._send(200, gzip.compress(b"hello " * 1000), "text/plain", gzip=True)
        else:
            echo = {
                "method": seen.method,
                "path": seen.path,
                "query": seen.query,
                "headers": seen.headers,
                "body": seen.body.decode(errors="replace"),
            }
            self._send(200, json.dumps(echo).encode(), "application/json")

    def _send(
        self,
        code: int,
        body: bytes,
        ctype: str,
        gzip: bool = False,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.send_response(code)
        self.send_header("Content-Type", f"{ctype}; charset=utf-8")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        if gzip:
            self.send_header("Content-Encoding", "gzip")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _redirect(self, code: int, location: str) -> None:
        self.send_response(code)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _chunked(self, chunks: list[bytes], delay: float, kind: str = "text/plain") -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for chunk in chunks:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.flush()
            time.sleep(delay)
        self.wfile.write(b"0\r\n\r\n")


def _serve(ssl_context: ssl.SSLContext | None = None) -> Iterator[LocalServer]:
    server = _Server(("127.0.0.1", 0), _Handler)
    if ssl_context is not None:
        server.socket = ssl_context.wrap_socket(server.socket, server_side=True)
    server.record = LocalServer("https" if ssl_context else "http", server.server_address[1])
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    try:
        yield server.record
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def server() -> Iterator[LocalServer]:
    yield from _serve()


@pytest.fixture
def other_server() -> Iterator[LocalServer]:
    yield from _serve()


@dataclass(frozen=True)
class Certs:
    ca: Path
    cert: Path
    key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    """A throwaway CA and a leaf certificate for ``tool.test``, made with the openssl CLI."""
    d = tmp_path_factory.mktemp("certs")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=treadle test CA",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)  # fmt: skip
    _openssl("req", *ec, "-keyout", "leaf.key", "-out", "leaf.csr", "-subj", "/CN=tool.test",
             cwd=d)  # fmt: skip
    (d / "leaf.ext").write_text(
        "subjectAltName=DNS:tool.test\nbasicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n"
    )
    _openssl("x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "leaf.pem", "-days", "2", "-extfile", "leaf.ext",
             cwd=d)  # fmt: skip
    return Certs(ca=d / "ca.pem", cert=d / "leaf.pem", key=d / "leaf.key")


@pytest.fixture
def tls_server(certs: Certs) -> Iterator[LocalServer]:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(certs.cert, certs.key)
    yield from _serve(ctx)


FakeDns = Callable[[dict[str, list[str]]], list[str]]


@pytest.fixture
def fake_dns(monkeypatch: pytest.MonkeyPatch) -> FakeDns:
    """Map host names to addresses for ``socket.getaddrinfo``; returns the list of lookups."""
    real = socket.getaddrinfo
    lookups: list[str] = []

    def install(table: dict[str, list[str]]) -> list[str]:
        def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
            if host not in table:
                return real(host, port, *args, **kwargs)
            lookups.append(host)
            return [_info(addr, int(port or 0)) for addr in table[host]]

        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
        return lookups

    return install


def _info(addr: str, port: int) -> tuple[Any, ...]:
    if ":" in addr:
        return (socket.AF_INET6, socket.SOCK_STREAM, 6, "", (addr, port, 0, 0))
    return (socket.AF_INET, socket.SOCK_STREAM, 6, "", (addr, port))
