"""Stopping a blocking call from outside: an ``Abort`` handle with a deadline and ``cancel()``.

A model call or a tool waits on the network, a subprocess or a sleep; a tenant controls how
long (its model server can stall, its document can be a bomb). The caller hands the call an
``Abort`` — the run's deadline, and a ``cancel()`` for run cancellation or a tool's timeout —
and the call makes its blocking waits interruptible:

* ``with abort.bound():`` marks the current thread as working for the handle. Every socket
  read, write and connect made through ``abortable_transport()`` in that thread is then
  bounded by the time left and registered with the handle, which shuts the socket down when
  it fires: a silent stream ends within ``WATCH_INTERVAL_S`` of the deadline or of
  ``cancel()``, instead of at the read timeout.
* ``with abort.closing(fn):`` runs ``fn`` when the handle fires (kill a subprocess, close a
  response that did not come through the transport).
* ``abort.wait(s)`` sleeps, ``abort.check()`` raises: ``DeadlineExceeded`` or
  ``CallCancelled`` (``shared.errors.Aborted``).

One watchdog thread per process fires the handles whose deadline passed; ``cancel()`` fires
at once. A handle fires once and stays fired.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import ssl
import threading
import time
import typing
from collections.abc import Callable, Iterable, Iterator

import httpcore
import httpx

from shared.ambient import WORKING_FOR
from shared.errors import Aborted, CallCancelled, DeadlineExceeded
from shared.llm.backend import Connect, OverBackend

__all__ = ["WATCH_INTERVAL_S", "Abort", "WatchedBackend", "abortable_transport", "current"]

WATCH_INTERVAL_S = 0.1


class Abort:
    """A blocking call's stop signal. ``deadline_at``: epoch seconds (``time.time()``), or
    None for no deadline (``cancel()`` only)."""

    def __init__(self, deadline_at: float | None = None) -> None:
        self.deadline_at = deadline_at
        self._fired = threading.Event()
        self._why: Aborted | None = None
        self._lock = threading.Lock()
        self._closers: list[Callable[[], None]] = []

    # -- state

    @property
    def fired(self) -> bool:
        """Cancelled, or past the deadline (noticed or not)."""
        return self._fired.is_set() or self.remaining() == 0.0

    def remaining(self) -> float | None:
        """Seconds to the deadline (0.0 once past it), None without one."""
        if self.deadline_at is None:
            return None
        return max(0.0, self.deadline_at - time.time())

    def limit(self, seconds: float | None) -> float | None:
        """``seconds`` shortened to the time left (a timeout for one blocking step)."""
        left = self.remaining()
        if left is None:
            return seconds
        return left if seconds is None else min(seconds, left)

    def error(self) -> Aborted:
        """Why the handle fired (a deadline, unless it was cancelled first)."""
        if self._why is not None:
            return self._why
        return DeadlineExceeded("the deadline passed")

    def check(self) -> None:
        """Raise the handle's ``Aborted`` error if it fired."""
        if self.fired:
            self._fire(self.error())
            raise self.error()

    def wait(self, seconds: float) -> None:
        """Sleep ``seconds``, or raise ``Aborted`` as soon as the handle fires."""
        self._fired.wait(self.limit(seconds))
        self.check()

    # -- firing

    def cancel(self, reason: str = "cancelled") -> None:
        """Stop the call now (thread-safe, idempotent)."""
        self._fire(CallCancelled(reason))

    def _fire(self, why: Aborted) -> None:
        with self._lock:
            if self._fired.is_set():
                return
            self._why = why
            self._fired.set()
            closers = list(self._closers)
        for close in closers:
            with contextlib.suppress(Exception):
                close()

    @contextlib.contextmanager
    def closing(self, closer: Callable[[], None]) -> Iterator[None]:
        """Run ``closer`` if the handle fires while the block runs (at once if it already has)."""
        with self._lock:
            self._closers.append(closer)
            already = self._fired.is_set()
        if already:
            with contextlib.suppress(Exception):
                closer()
        try:
            with _WATCHDOG.watching(self):
                yield
        finally:
            with self._lock:
                self._closers.remove(closer)

    @contextlib.contextmanager
    def bound(self) -> Iterator[None]:
        """The block works for this handle (see the module doc; threads it starts with a
        copy of its context too)."""
        token = WORKING_FOR.set(self)
        try:
            with _WATCHDOG.watching(self):
                yield
        finally:
            WORKING_FOR.reset(token)

    @contextlib.contextmanager
    def _io(self, sock: socket.socket | None) -> Iterator[None]:
        """One blocking socket step: shut the socket down if the handle fires meanwhile."""
        if sock is None:
            self.check()
            yield
            return
        with self.closing(lambda: _shutdown(sock)):
            self.check()
            yield


def current() -> Abort | None:
    """The handle the current block works for (``Abort.bound``), if any."""
    return typing.cast("Abort | None", WORKING_FOR.get())


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)  # the base method, also for SSL sockets


class _Watchdog:
    """Fires the handles whose deadline passed. One thread per process, started on demand
    (again after a fork), idle while nothing is watched."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._watched: dict[int, tuple[Abort, int]] = {}  # id → (handle, watchers)
        self._pid = 0

    @contextlib.contextmanager
    def watching(self, abort: Abort) -> Iterator[None]:
        if abort.deadline_at is None:  # nothing to time: cancel() fires by itself
            yield
            return
        key = id(abort)
        with self._cond:
            self._start()
            held = self._watched.get(key, (abort, 0))[1]
            self._watched[key] = (abort, held + 1)
            self._cond.notify()
        try:
            yield
        finally:
            with self._cond:
                handle, held = self._watched[key]
                if held <= 1:
                    del self._watched[key]
                else:
                    self._watched[key] = (handle, held - 1)

    def _start(self) -> None:
        if self._pid == os.getpid():
            return
        self._pid = os.getpid()
        threading.Thread(target=self._loop, name="abort-watchdog", daemon=True).start()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._watched:
                    self._cond.wait()
                due = [a for a, _ in self._watched.values() if a.remaining() == 0.0]
            for abort in due:
                abort._fire(DeadlineExceeded("the deadline passed"))
            time.sleep(WATCH_INTERVAL_S)


_WATCHDOG = _Watchdog()


# --------------------------------------------------------------------------- the transport


def _timeout(timeout: float | None) -> float | None:
    abort = current()
    return timeout if abort is None else abort.limit(timeout)


class _WatchedStream(httpcore.NetworkStream):
    """A connection whose blocking steps obey the current thread's ``Abort``."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def _step(self) -> contextlib.AbstractContextManager[None]:
        abort = current()
        if abort is None:
            return contextlib.nullcontext()
        sock = self._inner.get_extra_info("socket")
        return abort._io(sock if isinstance(sock, socket.socket) else None)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        with _as_read_error(), self._step():
            return self._inner.read(max_bytes, _timeout(timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        with _as_write_error(), self._step():
            self._inner.write(buffer, _timeout(timeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self,
        ssl_context: typing.Any,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        with _as_connect_error(), self._step():
            tls = self._inner.start_tls(ssl_context, server_hostname, _timeout(timeout))
        return _WatchedStream(tls)

    def get_extra_info(self, info: str) -> typing.Any:
        return self._inner.get_extra_info(info)


@contextlib.contextmanager
def _mapped(kind: type[Exception]) -> Iterator[None]:
    """An ``Aborted`` inside the transport surfaces as httpcore's error of that step (httpx
    maps it); the caller asks its handle why."""
    try:
        yield
    except Aborted as exc:
        raise kind(str(exc)) from exc


def _as_read_error() -> contextlib.AbstractContextManager[None]:
    return _mapped(httpcore.ReadError)


def _as_write_error() -> contextlib.AbstractContextManager[None]:
    return _mapped(httpcore.WriteError)


def _as_connect_error() -> contextlib.AbstractContextManager[None]:
    return _mapped(httpcore.ConnectError)


class WatchedBackend(OverBackend):
    """httpcore's network backend with every connection a ``_WatchedStream``. ``inner``: the
    backend that really connects (default: the plain synchronous one)."""

    def _tcp(
        self, host: str, port: int, timeout: float | None, connect: Connect
    ) -> httpcore.NetworkStream:
        abort = current()
        with _as_connect_error():
            if abort is not None:
                abort.check()
            stream = connect(host, _timeout(timeout))
        return _WatchedStream(stream)

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[typing.Any] | None = None,
    ) -> httpcore.NetworkStream:
        return _WatchedStream(self._inner.connect_unix_socket(path, _timeout(timeout)))


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """One verifying TLS context for every transport: building one costs ~50 ms (CA bundle)."""
    return httpx.create_ssl_context()


def abortable_transport(
    backend: httpcore.NetworkBackend | None = None,
    *,
    limits: httpx.Limits = httpx.Limits(max_connections=100, max_keepalive_connections=20),
) -> httpx.HTTPTransport:
    """An httpx transport whose connections obey the calling thread's ``Abort`` (and connect
    through ``backend``, e.g. the SSRF guard's pinning one). Proxies from the environment are
    not used. httpx has no public hook for a network backend: the pool is replaced."""
    transport = httpx.HTTPTransport(limits=limits, verify=_tls_context(), trust_env=False)
    transport._pool = httpcore.ConnectionPool(
        ssl_context=_tls_context(),
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry,
        network_backend=WatchedBackend(backend),
    )
    return transport
