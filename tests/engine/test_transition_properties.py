"""Random interleavings of transitions, checked against the invariants of the transition
module (``shared.engine.transition``), on SQLite and PostgreSQL.

A broker that never forgets: every dispatch ever published stays deliverable, so any step may
deliver a duplicate or a stale one. Between deliveries, runs are cancelled, the reaper re-sends
what the state says is due (as if every message had been lost), and the drain at the end must
bring every run to an end. After every step:

* at most one assistant message per run and round (one round committed per version);
* ``open_calls`` equals the unfinished external calls of the run's latest round;
* every tool call of an assistant message before the last one is answered exactly once, by a
  tool message after it and before the next assistant message; an ended run has none open.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.config import Settings
from shared.engine import commands
from shared.engine.reaper import reap
from shared.engine.runtime import Dispatch, Runtime
from shared.engine.testing import StubBroker
from shared.errors import Conflict
from shared.store import calls as call_store
from shared.store import records
from shared.store import runs as run_store
from shared.store.rows import FINAL, CallStatus, Status
from shared.store.tables import metadata
from tests.engine.helpers import agent, call, submit

REPLIES = [
    {"tool_calls": [call("echo", {"text": f"a{i}"}, f"a{i}") for i in range(3)]},
    {
        "tool_calls": [
            call("echo", {"text": "b0"}, "b0"),
            call("sleepy", {"seconds": 0, "label": "b1"}, "b1"),
        ]
    },
    {"text": "done"},
]
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("deliver"), st.integers(0, 10_000)),
        st.tuples(st.just("cancel"), st.integers(0, 3)),
        st.tuples(st.just("reap"), st.just(0)),
    ),
    min_size=5,
    max_size=60,
)


class Remembering(StubBroker):
    """Every dispatch stays deliverable (duplicates and stale ones included)."""

    def __init__(self) -> None:
        super().__init__()
        self.inbox: list[Dispatch] = []

    def __call__(self, items: list[Dispatch]) -> None:
        super().__call__(items)
        self.inbox += items


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[sa.Engine]:
    if request.param == "sqlite":
        rt: Runtime = request.getfixturevalue("sqlite_rt")
        yield rt.engine
    else:
        yield request.getfixturevalue("pg_engine")


def _runtime(engine: sa.Engine, broker: StubBroker) -> Runtime:
    url = engine.url.render_as_string(hide_password=False)
    settings = Settings(database_url=url, broker_url="memory://", redrive_seconds=0.001)
    return Runtime(engine=engine, settings=settings, publish=broker)


def _clear(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        for table in reversed(metadata.sorted_tables):
            if table.name != "workers":
                conn.execute(table.delete())


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=OPS)
def test_random_interleavings_keep_the_invariants(engine: sa.Engine, ops: list[Any]) -> None:
    _clear(engine)
    broker = Remembering()
    rt = _runtime(engine, broker)
    spec = agent(REPLIES, tools=["echo", "sleepy"], parallel_tools=2)
    run_ids = [submit(rt, spec, f"go {i}") for i in range(3)]
    for op, arg in ops:
        _step(rt, broker, run_ids, op, arg)
        _check(rt, run_ids)
    _drain(rt, broker)
    _check(rt, run_ids, ended=True)


def _step(rt: Runtime, broker: Remembering, run_ids: list[str], op: str, arg: int) -> None:
    if op == "deliver" and broker.inbox:
        broker.deliver(rt, broker.inbox[arg % len(broker.inbox)])
    elif op == "cancel" and arg < len(run_ids):
        try:
            commands.cancel_run(rt, "default", run_ids[arg])
        except Conflict:
            pass  # already ended
    elif op == "reap":
        reap(rt)


def _drain(rt: Runtime, broker: Remembering) -> None:
    """Deliver in a random order with duplicates, re-driving lost work, until all is done."""
    rng = random.Random(7)
    for _ in range(400):
        if not broker.queue:
            reap(rt)
            if not broker.queue:
                return
        batch = list(broker.queue)
        broker.queue.clear()
        rng.shuffle(batch)
        for d in batch + batch[: len(batch) // 2]:  # and some duplicates
            broker.deliver(rt, d)
    raise AssertionError("the runs did not end")


def _check(rt: Runtime, run_ids: list[str], ended: bool = False) -> None:
    with rt.engine.connect() as conn:
        for run_id in run_ids:
            run = run_store.load_run(conn, run_id)
            assert run is not None
            msgs = records.list_messages(conn, run_id)
            calls = call_store.list_tool_calls(conn, run_id)
            _one_reply_per_round(msgs)
            _open_calls_match(run, calls)
            _every_call_answered_once(msgs, closed=run.status in FINAL)
            if ended:
                assert run.status in (Status.COMPLETED, Status.CANCELLED), run


def _one_reply_per_round(msgs: list[Any]) -> None:
    per_round = Counter(m["round"] for m in msgs if m["role"] == "assistant")
    assert all(n == 1 for n in per_round.values()), per_round


def _open_calls_match(run: Any, calls: list[Any]) -> None:
    if run.status in FINAL or not calls:
        assert run.status not in FINAL or run.open_calls == 0
        return
    latest = max(c.round for c in calls)
    unfinished = [
        c
        for c in calls
        if c.round == latest
        and c.status in (CallStatus.PENDING, CallStatus.QUEUED, CallStatus.RUNNING)
    ]
    assert run.open_calls == len(unfinished), (run.open_calls, unfinished)


def _every_call_answered_once(msgs: list[Any], *, closed: bool) -> None:
    assistants = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
    for n, i in enumerate(assistants):
        ids = [c["id"] for c in msgs[i]["tool_calls"] or []]
        end = assistants[n + 1] if n + 1 < len(assistants) else len(msgs)
        answers = Counter(m["tool_call_id"] for m in msgs[i + 1 : end] if m["role"] == "tool")
        last = n + 1 == len(assistants)
        if last and not closed:
            assert all(answers[c] <= 1 for c in ids), answers  # the batch may be under way
        else:
            assert all(answers[c] == 1 for c in ids), (ids, answers)
        assert set(answers) <= set(ids), answers
