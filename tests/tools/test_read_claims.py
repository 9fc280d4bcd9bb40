"""A read-only call starts while its claim commits (``shared.engine.toolrun``): the claim is
off the round's critical path, still counts the attempt and writes ``tool.started``; a claim
that loses stops the read and drops its result. A write starts only after its claim. Against a
real local HTTP server."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest

from shared.engine import toolrun
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.store import calls as call_store
from shared.store import records
from tests.engine.helpers import agent, call, run, submit

from .conftest import LocalServer


def _rt(sqlite_rt: Runtime) -> Runtime:
    update = {"allow_hosts": "127.0.0.1"}
    return replace(sqlite_rt, settings=sqlite_rt.settings.model_copy(update=update))


def _spec(server: LocalServer, path: str, read_only: bool) -> Any:
    tool = {
        "name": "lookup",
        "description": "Look an item up.",
        "read_only": read_only,
        "parameters": {"type": "object", "properties": {"id": {"type": "string"}}},
        "http": {"method": "GET", "url": server.url(path) + "?id={id}"},
    }
    replies: list[dict[str, Any]] = [
        {"tool_calls": [call("lookup", {"id": "a"}, "c1")]},
        {"text": "done"},
    ]
    return agent(replies, tools=[tool])


def _queued(
    base: Runtime, stub: StubBroker, server: LocalServer, path: str, read_only: bool
) -> tuple[Runtime, str, int]:
    """A run whose first round queued its call ``c1``: the runtime, the run, its version."""
    rt = _rt(base)
    run_id = submit(rt, _spec(server, path, read_only))
    return rt, run_id, _tool_task(rt, stub, run_id).version


def _tool_task(rt: Runtime, stub: StubBroker, run_id: str) -> Any:
    first = stub.pop()
    assert first is not None and first.kind == "round"
    stub.deliver(rt, first)  # the first round: the call is queued
    d = stub.pop()
    assert d is not None and d.kind == "tool"
    return d


def _call(rt: Runtime, run_id: str) -> Any:
    with rt.engine.connect() as conn:
        found = call_store.get_call(conn, run_id, "c1")
    assert found is not None
    return found


def _types(rt: Runtime, run_id: str) -> list[str]:
    with rt.engine.connect() as conn:
        return [e["type"] for e in records.list_events(conn, run_id)]


def _watch_claims(
    monkeypatch: pytest.MonkeyPatch, server: LocalServer, *, after_a_request: bool
) -> list[int]:
    """The server's request count as each claim starts (``after_a_request``: the claim
    first waits up to 5 s for a request to arrive)."""
    seen: list[int] = []
    real = toolrun._claim

    def claim(*args: Any) -> Any:
        deadline = time.monotonic() + 5
        while after_a_request and not server.requests and time.monotonic() < deadline:
            time.sleep(0.005)
        seen.append(len(server.requests))
        return real(*args)

    monkeypatch.setattr(toolrun, "_claim", claim)
    return seen


def test_a_read_starts_before_its_claim_commits(
    any_rt: Runtime, stub: StubBroker, server: LocalServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt, run_id, version = _queued(any_rt, stub, server, "/item", read_only=True)
    seen = _watch_claims(monkeypatch, server, after_a_request=True)
    assert toolrun.run_tool(rt, run_id, "c1", version) == "committed"
    assert seen == [1]  # the read had reached the server when the claim ran
    c = _call(rt, run_id)
    assert (c.status.value, c.attempts) == ("done", 1)  # the attempt is counted
    assert [t for t in _types(rt, run_id) if t.startswith("tool.")] == [
        "tool.started",
        "tool.finished",
    ]
    stub.drain(rt)
    assert run(rt, run_id)["status"] == "completed"


def test_a_lost_claim_stops_the_read_and_writes_nothing(
    sqlite_rt: Runtime, stub: StubBroker, server: LocalServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the endpoint trickles for ~20 s: the read is stopped, not waited for
    rt, run_id, version = _queued(sqlite_rt, stub, server, "/slow", read_only=True)
    before = _types(rt, run_id)
    monkeypatch.setattr(toolrun, "_claim", lambda *args: None)  # another worker took it
    started = time.monotonic()
    assert toolrun.run_tool(rt, run_id, "c1", version) == "stale"
    assert time.monotonic() - started < 5
    c = _call(rt, run_id)
    assert (c.status.value, c.attempts, c.result) == ("queued", 0, None)
    assert _types(rt, run_id) == before


def test_a_write_starts_only_after_its_claim(
    sqlite_rt: Runtime, stub: StubBroker, server: LocalServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt, run_id, version = _queued(sqlite_rt, stub, server, "/item", read_only=False)
    seen = _watch_claims(monkeypatch, server, after_a_request=False)
    assert toolrun.run_tool(rt, run_id, "c1", version) == "committed"
    assert seen == [0] and len(server.requests) == 1
