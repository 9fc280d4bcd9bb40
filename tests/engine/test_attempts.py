"""Bounded attempts (L-12), on SQLite and PostgreSQL: a round or a tool call that keeps failing
— it raises, or its worker dies in the middle — ends within its agent's ``max_attempts``; every
attempt's model call is in ``/usage``; a failed run resumes after the fix and completes.

The failures are deterministic and injected where they happen in production: a router handler
that raises (the spec), a reply the round cannot take (a bug met after the model call), an
output schema whose ``$ref`` points at nothing (stored before submit checked it), a worker
that dies in the middle of a round, and one that dies in the middle of a tool call.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.agent.spec import AgentSpec
from shared.config import Settings
from shared.engine import lifecycle, toolrun
from shared.engine import round as round_mod
from shared.engine.reaper import reap
from shared.engine.runtime import Dispatch, Runtime
from shared.engine.testing import StubBroker
from shared.errors import TransientModelError
from shared.llm.scripted import ScriptedModel
from shared.store import calls as call_store
from shared.store import records, redrive
from shared.store import runs as run_store
from shared.store.rows import FINAL
from shared.store.tables import metadata, runs, tool_calls, usage
from tests.engine.helpers import agent, call, run, submit
from tests.plugins import WorkerLost

ME = lifecycle.Actor("default", None)
KINDS = ["handler", "reply", "schema", "round_lost", "tool_lost"]
SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}}
DANGLING = {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest) -> Iterator[sa.Engine]:
    if request.param == "sqlite":
        rt: Runtime = request.getfixturevalue("sqlite_rt")
        yield rt.engine
    else:
        yield request.getfixturevalue("pg_engine")


def _runtime(engine: sa.Engine, stub: StubBroker) -> Runtime:
    url = engine.url.render_as_string(hide_password=False)
    return Runtime(engine=engine, settings=Settings(database_url=url), publish=stub)


def _clear(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        for table in reversed(metadata.sorted_tables):
            if table.name != "workers":
                conn.execute(table.delete())


class Calls:
    """Counts the model calls (every attempt's)."""

    def __init__(self) -> None:
        self.n = 0


@contextmanager
def counted(calls: Calls) -> Iterator[None]:
    real = ScriptedModel.complete

    def complete(self: ScriptedModel, *a: Any, **kw: Any) -> Any:
        calls.n += 1
        return real(self, *a, **kw)

    with mock.patch.object(ScriptedModel, "complete", complete):
        yield


@contextmanager
def injected(kind: str) -> Iterator[None]:
    """The failures that live in code (the others are in the spec)."""
    real = round_mod.step

    def step(spec: AgentSpec, state: Any, reply: Any, *a: Any, **kw: Any) -> Any:
        if reply.text == "POISON":
            if kind == "reply":
                raise ValueError("a reply this code cannot take")
            raise WorkerLost("the worker died mid-round")
        return real(spec, state, reply, *a, **kw)

    real_execute = toolrun.execute_tool

    def execute(rt: Runtime, run: Any, inputs: Any, tool: Any, call: Any) -> Any:
        if call.name == "lost":  # the worker dies in the task's own thread
            raise WorkerLost(f"the worker died during {call.call_id}")
        return real_execute(rt, run, inputs, tool, call)

    with (
        mock.patch.object(round_mod, "step", step),
        mock.patch.object(toolrun, "execute_tool", execute),
    ):
        yield


def _spec(kind: str, k: int) -> AgentSpec:
    if kind == "handler":
        router = [{"any": ["go"], "handler": "poisoned"}]
        return agent([{"text": "unused"}], router=router, max_attempts=k)
    if kind in ("reply", "round_lost"):
        return agent([{"text": "POISON"}], max_attempts=k)
    if kind == "schema":
        return agent([{"text": '{"a": "x"}'}], output_schema=SCHEMA, max_attempts=k)
    replies = [{"tool_calls": [call("lost", {}, "t1")]}, {"text": "done"}]
    return agent(replies, tools=["lost"], max_attempts=k)


def _store_dangling_schema(rt: Runtime, run_id: str) -> None:
    """A spec stored before submit checked ``$ref``s (an older release let it in)."""
    with rt.engine.begin() as conn:
        spec = dict(run_store.run_spec(conn, run_id)[0])
        run_store.set_agent(conn, run_id, {**spec, "output_schema": DANGLING})
        conn.execute(
            sa.update(runs).where(runs.c.id == run_id).values(spec_rev=runs.c.spec_rev + 1)
        )


def _lose_worker(rt: Runtime, run_id: str) -> None:
    """The worker that held the run's round or call died: its leases belong to nobody alive."""
    with rt.engine.begin() as conn:
        conn.execute(
            sa.update(runs)
            .where(runs.c.id == run_id, runs.c.lease_owner.is_not(None))
            .values(lease_owner="dead-worker")
        )
        conn.execute(
            sa.update(tool_calls)
            .where(tool_calls.c.run_id == run_id, tool_calls.c.lease_owner.is_not(None))
            .values(lease_owner="dead-worker")
        )


def _drive(rt: Runtime, stub: StubBroker, run_id: str) -> tuple[Any, int]:
    """Deliver, losing workers as the failures say, until the run ends or pauses; returns
    the run and how many round claims it took."""
    claims = 0
    for _ in range(60):
        while (d := stub.pop()) is not None:
            claims += d.kind == "round"
            try:
                stub.deliver(rt, d)
            except WorkerLost:
                _lose_worker(rt, run_id)
        r = run(rt, run_id)
        if r["status"] in FINAL or r["status"] == "waiting":
            return r, claims
        reap(rt)  # re-sends what the state says is due (a dead worker's work at once)
    raise AssertionError(f"run {run_id} never ended: {run(rt, run_id)['status']}")


def _usage_rows(rt: Runtime, run_id: str) -> int:
    with rt.engine.connect() as conn:
        q = sa.select(sa.func.count()).select_from(usage).where(usage.c.run_id == run_id)
        return int(conn.execute(q).scalar_one())


def _fixed(kind: str) -> dict[str, Any] | None:
    """The fix: a new spec (the resume's overrides), or None (the code was fixed)."""
    if kind == "handler":
        return {"router": [{"any": ["go"], "handler": "echo"}]}
    if kind == "schema":
        return {"output_schema": SCHEMA}
    return None


@settings(
    max_examples=20,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(kind=st.sampled_from(KINDS), k=st.integers(1, 4))
def test_every_failure_ends_within_its_attempt_bound(engine: sa.Engine, kind: str, k: int) -> None:
    _clear(engine)
    stub = StubBroker()
    rt = _runtime(engine, stub)
    calls = Calls()
    with counted(calls), injected(kind):
        run_id = submit(rt, _spec(kind, k))
        if kind == "schema":
            _store_dangling_schema(rt, run_id)
        r, claims = _drive(rt, stub, run_id)
    if kind == "tool_lost":  # a tool is data: the model is told, and the run goes on
        assert r["status"] == "completed", r["error"]
        with rt.engine.connect() as conn:
            (lost,) = [c for c in call_store.list_tool_calls(conn, run_id) if c.name == "lost"]
        assert lost.attempts == k + 1 and "attempted" in (lost.result or "")
    else:
        assert r["status"] == "failed", r["status"]
        fatal = kind == "schema"
        assert r["stop_reason"] == ("round_error" if fatal else "attempts_exhausted")
        assert claims == (1 if fatal else k + (kind == "round_lost"))
        expected = {
            "handler": "poisoned handler",
            "reply": "a reply this code cannot take",
            "schema": "points",
            "round_lost": "never finished",
        }[kind]
        assert expected in r["error"]["message"], r["error"]
    assert _usage_rows(rt, run_id) == calls.n  # every attempt's model call is billed
    if r["status"] == "failed":
        _resume_fixed(rt, stub, run_id, kind)


def _resume_fixed(rt: Runtime, stub: StubBroker, run_id: str, kind: str) -> None:
    overrides = _fixed(kind)
    new = None
    if overrides is not None:
        merged = lifecycle.merge_spec(run(rt, run_id)["agent"], overrides)
        new = lifecycle.NewSpec(merged, overrides, run(rt, run_id)["spec_rev"])
    calls = Calls()
    with counted(calls):
        lifecycle.resume_run(rt, ME, run_id, new)
        r, _ = _drive(rt, stub, run_id)
    assert r["status"] == "completed", r["error"]
    assert r["attempts"] == 0 and r["last_error"] is None


def test_a_retried_round_records_why_and_a_commit_forgets_it(
    sqlite_rt: Runtime, stub: StubBroker
) -> None:
    spec = agent([{"text": "POISON"}], max_attempts=3)
    run_id = submit(sqlite_rt, spec)
    with injected("reply"):
        assert stub.deliver(sqlite_rt, stub.pop()) == "retry"  # type: ignore[arg-type]
    r = run(sqlite_rt, run_id)
    assert r["status"] == "running" and r["attempts"] == 1 and r["lease_owner"] is None
    assert r["last_error"]["type"] == "ValueError" and r["last_error"]["attempt"] == 1
    retry = stub.pop()
    assert retry is not None and retry.countdown == 1.0  # backoff 1, 2, 4 … s
    assert stub.deliver(sqlite_rt, retry) == "committed"  # the code was fixed meanwhile
    r = run(sqlite_rt, run_id)
    assert r["status"] == "completed" and r["attempts"] == 0 and r["last_error"] is None


def test_a_transient_model_error_does_not_spend_an_attempt(
    sqlite_rt: Runtime, stub: StubBroker
) -> None:
    real, failures = ScriptedModel.complete, [503, 429, 500]

    def flaky(self: ScriptedModel, *a: Any, **kw: Any) -> Any:
        if failures:
            raise TransientModelError("busy", status=failures.pop())
        return real(self, *a, **kw)

    run_id = submit(sqlite_rt, agent([{"text": "ok"}], max_attempts=1))
    with mock.patch.object(ScriptedModel, "complete", flaky):
        stub.drain(sqlite_rt)
    r = run(sqlite_rt, run_id)
    assert r["status"] == "completed" and r["result"]["text"] == "ok", r["error"]
    assert len(stub.retries) == 3  # three transient retries, none of them an attempt


def test_a_round_re_run_after_a_database_outage_leaves_every_usage_row(
    sqlite_rt: Runtime, stub: StubBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # L-12: the round's commit fails on a database restart (the connection is gone); the
    # round is given back and re-run, calling the model again: the first call is billed too
    from sqlalchemy.exc import OperationalError

    real = round_mod.when_free
    failed: list[int] = []

    def outage_once(fn: Any, what: str, **kw: Any) -> Any:
        if not failed:
            failed.append(1)
            raise OperationalError("UPDATE runs", {}, Exception("server closed the connection"))
        return real(fn, what, **kw)

    monkeypatch.setattr(round_mod, "when_free", outage_once)
    run_id = submit(sqlite_rt, agent([{"text": "the answer"}], kind="chat"))
    calls = Calls()
    with counted(calls):
        with pytest.raises(OperationalError):
            stub.drain(sqlite_rt)  # the task raises: its retry (here: the reaper) re-runs it
        assert run(sqlite_rt, run_id)["status"] == "running"
        with sqlite_rt.engine.begin() as conn:
            due = redrive.due_rounds(conn, run_store.now() + 3600, 0.0, run_store.now())
        stub.queue += [Dispatch.round(d.run_id, d.version) for d in due if d.run_id == run_id]
        stub.drain(sqlite_rt)
    assert run(sqlite_rt, run_id)["status"] == "completed"
    assert calls.n == 2
    with sqlite_rt.engine.connect() as conn:
        rows = records.usage_of_run(conn, run_id)
    assert sorted(r["committed"] for r in rows) == [False, True]  # one row per model call


def test_usage_rows_owed_while_the_database_is_down_are_written_by_the_lease_sweep(
    engine: sa.Engine, stub: StubBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # L-12: the commit fails and so does the release (the database still down): the process
    # still holds the lease; its sweep gives it back with the call's usage row
    from sqlalchemy.exc import OperationalError

    rt = _runtime(engine, stub)  # SQLite, then PostgreSQL

    down = OperationalError("UPDATE runs", {}, Exception("server closed the connection"))
    real_free, real_release = round_mod.when_free, run_store.release_round
    failed: list[str] = []

    def commit_down(fn: Any, what: str, **kw: Any) -> Any:
        if "commit" not in failed:
            failed.append("commit")
            raise down
        return real_free(fn, what, **kw)

    def release_down(*a: Any, **kw: Any) -> Any:
        if "release" not in failed:
            failed.append("release")
            raise down
        return real_release(*a, **kw)

    monkeypatch.setattr(round_mod, "when_free", commit_down)
    monkeypatch.setattr(run_store, "release_round", release_down)
    run_id = submit(rt, agent([{"text": "the answer"}], kind="chat"))
    with pytest.raises(OperationalError):
        stub.drain(rt)
    assert failed == ["commit", "release"]
    with rt.engine.connect() as conn:
        assert records.usage_of_run(conn, run_id) == []  # not written yet: owed
    assert rt.heartbeat.sweep(rt.engine) == 1  # the database is back
    with rt.engine.begin() as conn:
        [owed] = records.usage_of_run(conn, run_id)
        due = redrive.due_rounds(conn, run_store.now() + 3600, 0.0, run_store.now())
    assert owed["committed"] is False
    stub.queue += [Dispatch.round(d.run_id, d.version) for d in due if d.run_id == run_id]
    stub.drain(rt)
    assert run(rt, run_id)["status"] == "completed"
    with rt.engine.connect() as conn:
        rows = records.usage_of_run(conn, run_id)
    assert sorted(r["committed"] for r in rows) == [False, True]
    assert run(rt, run_id)["cost"] == pytest.approx(sum(r["cost"] for r in rows))
