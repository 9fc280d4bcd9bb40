"""Threads kept for tool calls (``shared.engine.standby``): reused, never short, given up on
at a tool's timeout, gone when idle."""

from __future__ import annotations

import contextvars
import threading
import time
from dataclasses import replace
from typing import Any

import pytest

from shared.engine import toolrun
from shared.engine.runtime import Runtime
from shared.engine.standby import BUSY_NAME, IDLE_NAME, Standby
from shared.engine.testing import StubBroker
from tests.engine.helpers import agent, call, run, submit, transcript

TOOLS = ["echo", "sleepy"]
WHO = contextvars.ContextVar("who", default="nobody")


def test_a_finished_thread_takes_the_next_call() -> None:
    standby = Standby()
    names: list[str] = []
    for _ in range(5):
        job = standby.submit(lambda: threading.current_thread().name)
        assert job.wait(5) and job.result is not None
        names.append(job.result)
        wait_idle(standby, 1)
    assert standby.started == 1 and names == [BUSY_NAME] * 5
    assert [t.name for t in threading.enumerate() if _ours(t, standby)] == [IDLE_NAME]


def test_concurrent_calls_each_get_a_thread() -> None:
    standby = Standby()
    release = threading.Event()
    jobs = [standby.submit(lambda: release.wait(5)) for _ in range(4)]
    time.sleep(0.1)
    assert standby.started == 4 and not any(j.wait(0) for j in jobs)  # none waits for another
    release.set()
    assert all(j.wait(5) and j.result for j in jobs)
    wait_idle(standby, 4)
    again = [standby.submit(lambda: 1) for _ in range(4)]
    assert all(j.wait(5) and j.result == 1 for j in again) and standby.started == 4


def test_a_call_runs_in_its_callers_context_and_leaves_none_behind() -> None:
    standby = Standby()
    token = WHO.set("tenant a")
    try:
        first = standby.submit(lambda: (WHO.get(), WHO.set("changed by the tool")))
    finally:
        WHO.reset(token)
    assert first.wait(5) and first.result is not None and first.result[0] == "tenant a"
    wait_idle(standby, 1)
    second = standby.submit(WHO.get)  # the same thread, another caller's (empty) context
    assert second.wait(5) and second.result == "nobody" and standby.started == 1


def test_a_call_that_raises_ends_without_a_result_and_frees_its_thread() -> None:
    standby = Standby()
    job = standby.submit(lambda: 1 / 0)
    assert job.wait(5) and job.result is None and isinstance(job.error, ZeroDivisionError)
    wait_idle(standby, 1)


def test_idle_threads_leave() -> None:
    standby = Standby(idle_s=0.1)
    jobs = [standby.submit(lambda: time.sleep(0.05)) for _ in range(3)]
    assert all(j.wait(5) for j in jobs)
    deadline = time.monotonic() + 5
    while standby.idle() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert standby.idle() == 0
    assert not [t for t in threading.enumerate() if _ours(t, standby)]
    job = standby.submit(lambda: 2)  # a call after they left starts one again
    assert job.wait(5) and job.result == 2 and standby.started == 4


def test_a_tool_past_its_timeout_is_given_up_and_the_run_goes_on(
    sqlite_rt: Runtime, stub: StubBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a tool that ignores its abort (a plain sleep): its call ends at the timeout (+ the
    # grace), its thread is left to finish, and the next call does not wait for it
    monkeypatch.setattr(toolrun, "STOP_GRACE_S", 0.1)
    rt = replace(sqlite_rt, settings=sqlite_rt.settings.model_copy(update={"tool_timeout": 0.3}))
    replies: list[dict[str, Any]] = [
        {"tool_calls": [call("sleepy", {"seconds": 2}, "s1")]},
        {"tool_calls": [call("echo", {"text": "after"}, "e1")]},
        {"text": "done"},
    ]
    started = time.monotonic()
    run_id = submit(rt, agent(replies, tools=TOOLS))
    stub.drain(rt)
    assert time.monotonic() - started < 1.5
    assert run(rt, run_id)["status"] == "completed"
    tools = [t[1] for t in transcript(rt, run_id) if t[0] == "tool"]
    assert tools == ["Tool error: timed out after 0.3s", "after"]
    assert rt.tool_threads.started == 2  # the sleeping thread was not waited for


def wait_idle(standby: Standby, n: int) -> None:
    deadline = time.monotonic() + 5
    while standby.idle() < n and time.monotonic() < deadline:
        time.sleep(0.005)
    assert standby.idle() == n


def _ours(t: threading.Thread, standby: Standby) -> bool:
    target = getattr(t, "_target", None)
    return getattr(target, "__self__", None) is standby
