"""A streamed model call gives its connection back to the pool: the body is read to its end
after ``[DONE]`` (httpcore closes a connection whose response was not read to the end, so
every call opened a new connection — against a real provider, a TLS handshake per round).
A server that holds the body open after ``[DONE]`` costs at most ``DRAIN_S``, not a timeout."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from shared.llm.fake_server import FakeLLMServer
from shared.llm.openai_compat import DRAIN_S, OpenAICompatModel
from shared.llm.profiles import http_client

from .helpers import profile, request, user


def _connections(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    opened: list[Any] = []
    real = socket.create_connection

    def counting(address: Any, *args: Any, **kw: Any) -> socket.socket:
        opened.append(address)
        return real(address, *args, **kw)

    monkeypatch.setattr(socket, "create_connection", counting)
    return opened


def test_streamed_calls_reuse_one_kept_alive_connection(
    fake: FakeLLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened = _connections(monkeypatch)
    client = http_client(fake.base_url + "/keep-alive-test")  # its own pool
    model = OpenAICompatModel(profile(base_url=fake.base_url), client=client)
    for i in range(4):
        reply = model.complete(request(user(f"hi {i}")))
        assert reply.text == f"echo: hi {i}"
    assert len(opened) == 1


def _held_open_server(stop: threading.Event) -> tuple[int, threading.Thread]:
    """An HTTP/1.1 server whose chunked SSE body sends ``[DONE]`` and then never ends."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    delta = '{"index":0,"delta":{"content":"done here"},"finish_reason":"stop"}'
    chunk = f'data: {{"choices":[{delta}]}}\n\ndata: [DONE]\n\n'.encode()

    def serve() -> None:
        conn, _ = listener.accept()
        with conn, listener:
            conn.recv(65536)
            conn.sendall(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n"
                + f"{len(chunk):x}\r\n".encode()
                + chunk
                + b"\r\n"
            )
            stop.wait(10)  # the body's last chunk never comes

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return port, t


@pytest.fixture
def held_open() -> Iterator[int]:
    stop = threading.Event()
    port, t = _held_open_server(stop)
    yield port
    stop.set()
    t.join(5)


def test_a_body_held_open_after_done_costs_at_most_the_drain(held_open: int) -> None:
    model = OpenAICompatModel(profile(base_url=f"http://127.0.0.1:{held_open}/v1"))
    started = time.monotonic()
    reply = model.complete(request(user("hi")))
    took = time.monotonic() - started
    assert reply.text == "done here"
    assert reply.finish_reason == "stop"
    assert took < DRAIN_S + 1.0  # not the read timeout
    model.close()
