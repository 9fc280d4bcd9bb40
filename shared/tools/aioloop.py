"""One asyncio event loop per process, in its own daemon thread, for the async libraries the
synchronous engine calls (the ``mcp`` SDK).

A worker runs tasks in a pool of threads; each call submits its coroutine to this loop and
blocks its own thread on the result, so no thread creates or leaks an event loop of its own.
The loop is started on first use and again in a forked child (a fork keeps no threads).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["LoopTimeout", "run_async", "submit"]

T = TypeVar("T")
_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_pid = 0


class LoopTimeout(TimeoutError):
    """The coroutine did not finish in time; it was cancelled."""


def _running_loop() -> asyncio.AbstractEventLoop:
    global _loop, _pid
    with _lock:
        if _loop is None or _pid != os.getpid() or not _loop.is_running():
            loop = asyncio.new_event_loop()
            started = threading.Event()

            def serve() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(started.set)
                loop.run_forever()

            threading.Thread(target=serve, name="treadle-aio", daemon=True).start()
            started.wait()
            _loop, _pid = loop, os.getpid()
        return _loop


def run_async(make: Callable[[], Awaitable[T]], timeout: float) -> T:
    """Run ``make()`` on the process's loop and wait at most ``timeout`` seconds for it; past
    that the coroutine is cancelled (its ``finally`` blocks run on the loop) and
    ``LoopTimeout`` is raised. Not to be called from the loop's own thread."""

    async def call() -> T:
        return await make()

    future = asyncio.run_coroutine_threadsafe(call(), _running_loop())
    try:
        return future.result(timeout)
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise LoopTimeout(f"timed out after {timeout:g}s") from None


def submit(make: Callable[[], Awaitable[T]], timeout: float) -> concurrent.futures.Future[T]:
    """Start ``make()`` on the process's loop without waiting for it: the future it returns
    ends with its result, its error, or ``LoopTimeout`` after ``timeout`` seconds (the
    coroutine is cancelled then). Nobody has to wait for it: it ends on its own."""

    async def call() -> T:
        try:
            return await asyncio.wait_for(make(), timeout)
        except TimeoutError:
            raise LoopTimeout(f"timed out after {timeout:g}s") from None

    return asyncio.run_coroutine_threadsafe(call(), _running_loop())
