"""Threads kept for running tool calls: a call is handed to an idle one, not to a new thread.

A tool call runs in a thread of its own so that its timeout holds whatever the tool does: the
caller waits at most the timeout and a grace, then gives the thread up (``shared.engine.toolrun``).
Starting a thread for each call cost ~0.9 ms of a tool round's wall time on the path users run
(a worker sampled by py-spy with idle threads: ``Thread.start`` was 13 % of the tool task, more
than the loopback HTTP call itself). A thread that finishes its call now waits ``IDLE_S`` for
the next one and leaves when none comes. A thread given up on is not waited for: when its tool
ends, it waits for the next call like the others. Each call runs in a copy of its caller's
context (its spans join the caller's); a kept thread carries nothing from one call to the next
(no tool code in this process keeps ``threading.local`` state).

Not a ``ThreadPoolExecutor``: its threads are a fixed number, so a tool that ignores its abort
would hold one for good, and once all were held, calls would queue behind them.
"""

from __future__ import annotations

import contextvars
import queue
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["BUSY_NAME", "IDLE_NAME", "IDLE_S", "Job", "Standby"]

IDLE_S = 30.0  # an idle kept thread leaves after this long without a call
BUSY_NAME, IDLE_NAME = "tool-exec", "standby"  # a kept thread's name, running a call or not

T = TypeVar("T")


class Job(Generic[T]):
    """One call handed to a kept thread: ``wait`` for it, then read ``result``."""

    def __init__(self, fn: Callable[[], T]) -> None:
        self._context = contextvars.copy_context()
        self._fn = fn
        self._done = threading.Event()
        self._result: T | None = None
        self.error: BaseException | None = None  # what the call raised, if it did

    def wait(self, timeout: float | None) -> bool:
        """True once the call has ended (within ``timeout`` seconds)."""
        return self._done.wait(timeout)

    @property
    def result(self) -> T | None:
        """What the call returned; None while it runs, or if it raised."""
        return self._result

    def _run(self) -> None:
        try:
            self._result = self._context.run(self._fn)
        except BaseException as exc:  # a call that raises ends without a result; the thread
            self.error = exc  # stays to take the next one
        finally:
            self._done.set()


class Standby:
    """A process's kept threads for tool calls (on the ``Runtime``). ``started`` counts the
    threads it has started."""

    def __init__(self, idle_s: float = IDLE_S) -> None:
        self._jobs: queue.SimpleQueue[Job[Any]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # threads waiting for a call that no call has been promised to yet
        self._idle_s = idle_s
        self.started = 0

    def submit(self, fn: Callable[[], T]) -> Job[T]:
        """Run ``fn`` in an idle kept thread, or in a new one when none is idle."""
        job = Job(fn)
        with self._lock:
            spawn = self._idle == 0
            if spawn:
                self.started += 1
            else:
                self._idle -= 1  # promised to one of the waiting threads
        self._jobs.put(job)
        if spawn:
            threading.Thread(target=self._serve, daemon=True, name=IDLE_NAME).start()
        return job

    def idle(self) -> int:
        """Threads waiting for a call."""
        with self._lock:
            return self._idle

    def _serve(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=self._idle_s)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0:  # not promised a call: leave
                        self._idle -= 1
                        return
                continue  # a call was promised to a waiting thread: it is on its way
            me = threading.current_thread()
            me.name = BUSY_NAME
            job._run()
            me.name = IDLE_NAME
            with self._lock:
                self._idle += 1
