"""A network backend over another one (httpcore's ``NetworkBackend``): the TCP connect goes
through one hook, ``_tcp``, that may check the host, change the timeout or wrap the stream;
sleeping is the inner backend's. The abort watch (``shared.llm.abort``) and the SSRF guard
(``shared.tools.netguard``) are such backends."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import httpcore

__all__ = ["Connect", "OverBackend"]

Connect = Callable[[str, float | None], httpcore.NetworkStream]
"""The inner backend's TCP connect to ``(host or address, timeout)``; the port, local address
and socket options are the caller's."""


class OverBackend(httpcore.NetworkBackend):
    """``inner``: the backend that really connects (default: the plain synchronous one)."""

    def __init__(self, inner: httpcore.NetworkBackend | None = None) -> None:
        self._inner = inner or httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        def connect(to: str, wait: float | None) -> httpcore.NetworkStream:
            return self._inner.connect_tcp(to, port, wait, local_address, socket_options)

        return self._tcp(host, port, timeout, connect)

    def _tcp(
        self, host: str, port: int, timeout: float | None, connect: Connect
    ) -> httpcore.NetworkStream:
        """This backend's TCP connect: by default, the inner one's as asked."""
        return connect(host, timeout)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)
