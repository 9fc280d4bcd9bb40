"""Money (docs/cost.md), on the stub broker, SQLite and PostgreSQL: every call reserves its
worst case against its run's ``max_cost`` and the spend envelopes it counts against, and
settles to its real cost after, so no cap is overshot; a full envelope makes its runs wait
(or fail) and raising it lets them go on; a monthly envelope starts again next month."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.agent.spend import period_window
from shared.config import Settings
from shared.engine.reaper import reap
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.store import runs as run_store
from shared.store import spend as store
from shared.store.tables import metadata, usage
from tests.engine.helpers import agent, call, run, submit

WORDS = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor "


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


def _usage_cost(rt: Runtime, *run_ids: str) -> float:
    with rt.engine.connect() as conn:
        q = sa.select(sa.func.coalesce(sa.func.sum(usage.c.cost), 0.0)).where(
            usage.c.run_id.in_(run_ids)
        )
        return float(conn.execute(q).scalar_one())


def _pricing(tiers: list[tuple[int | None, float, float]]) -> dict[str, Any]:
    return {"tiers": [{"max_input_tokens": m, "input": i, "output": o} for m, i, o in tiers]}


def _spender(rounds: int, words: int, pricing: dict[str, Any], max_tokens: int, **spec: Any) -> Any:
    replies: list[dict[str, Any]] = [
        {"text": WORDS * words, "tool_calls": [call("echo", {"text": "x"}, f"s{i}")]}
        for i in range(rounds)
    ]
    replies.append({"text": WORDS * words})
    model = {"pricing": pricing, "max_tokens": max_tokens}
    return agent(replies, tools=["echo"], max_rounds=rounds + 1, model_extra=model, **spec)


TIERS = st.lists(
    st.tuples(
        st.one_of(st.none(), st.integers(50, 5000)),
        st.floats(0.0, 0.5, allow_nan=False),
        st.floats(0.0, 2.0, allow_nan=False),
    ),
    min_size=1,
    max_size=3,
).map(lambda ts: sorted(ts, key=lambda t: (t[0] is None, t[0] or 0)))


@settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    tiers=TIERS,
    max_tokens=st.integers(16, 4096),
    words=st.integers(1, 60),
    cap=st.floats(0.001, 0.5, allow_nan=False),
    children=st.integers(0, 3),
)
def test_a_run_never_ends_above_its_max_cost(
    engine: sa.Engine, tiers: Any, max_tokens: int, words: int, cap: float, children: int
) -> None:
    _clear(engine)
    stub = StubBroker()
    rt = _runtime(engine, stub)
    pricing = _pricing(tiers)
    child = _spender(4, words, pricing, max_tokens)
    if children:
        calls = [call(f"kid{i}", {"input": "spend"}, f"k{i}") for i in range(children)]
        tools = [
            {
                "name": f"kid{i}",
                "description": "a sub-agent",
                "agent": child.model_dump(mode="json", exclude_none=True),
            }
            for i in range(children)
        ]
        spec = agent(
            [{"tool_calls": calls}, {"text": WORDS * words}],
            tools=tools,
            parallel_tools=children,
            budget={"max_cost": cap},
            model_extra={"pricing": pricing, "max_tokens": max_tokens},
        )
    else:
        spec = _spender(5, words, pricing, max_tokens, budget={"max_cost": cap})
    run_id = submit(rt, spec)
    stub.drain(rt)
    r = run(rt, run_id)
    assert r["status"] in ("completed", "failed"), r["status"]
    assert r["cost"] <= cap + 1e-9, (r["cost"], cap, r["stop_reason"])
    with rt.engine.connect() as conn:
        kids = [k.id for k in store_children(conn, run_id)]
    assert _usage_cost(rt, run_id, *kids) <= cap + 1e-9
    assert r["reserved"] == 0


def store_children(conn: sa.Connection, run_id: str) -> list[Any]:
    from shared.store import ancestry

    return [run_store.load_run(conn, i) for i in ancestry.descendant_ids(conn, run_id)]  # type: ignore[misc]


def _envelope(rt: Runtime, cap: float, *, scope: str = "tenant", key: str = "", **kw: Any) -> None:
    with rt.engine.begin() as conn:
        store.put_envelope(
            conn,
            "default",
            scope,
            key,
            period=kw.get("period", "day"),
            cap=cap,
            on_exceed=kw.get("on_exceed", "wait"),
            timezone="UTC",
            ts=run_store.now(),
        )
    rt.envelopes.changed()


def _envelope_row(rt: Runtime, scope: str = "tenant", key: str = "") -> store.Envelope:
    with rt.engine.connect() as conn:
        found = store.get_envelope(conn, "default", scope, key)
    assert found is not None
    return found


PRICED = _pricing([(None, 0.1, 0.1)])


def test_a_full_envelope_makes_runs_wait_and_raising_it_lets_them_go_on(
    sqlite_rt: Runtime, stub: StubBroker
) -> None:
    _envelope(sqlite_rt, 0.5)
    ids = [submit(sqlite_rt, _spender(2, 20, PRICED, 200)) for _ in range(6)]
    stub.drain(sqlite_rt)
    states = [run(sqlite_rt, i) for i in ids]
    waiting = [r for r in states if r["status"] == "waiting"]
    assert waiting and all(r["pending"]["kind"] == "budget" for r in waiting)
    envelope = _envelope_row(sqlite_rt)
    assert envelope.spent <= envelope.cap + 1e-9 and envelope.reserved == pytest.approx(0.0)
    assert envelope.spent == pytest.approx(sum(r["cost"] for r in states))
    _envelope(sqlite_rt, 100.0)
    with sqlite_rt.engine.begin() as conn:
        store.wake_waiting(conn, "default", run_store.now())
    reap(sqlite_rt)
    stub.drain(sqlite_rt)
    assert all(run(sqlite_rt, i)["status"] == "completed" for i in ids)


def test_an_envelope_that_fails_its_runs(sqlite_rt: Runtime, stub: StubBroker) -> None:
    _envelope(sqlite_rt, 0.0001, on_exceed="fail")
    run_id = submit(sqlite_rt, _spender(1, 5, PRICED, 200))
    stub.drain(sqlite_rt)
    r = run(sqlite_rt, run_id)
    assert r["status"] == "failed" and r["stop_reason"] == "budget_envelope"


def test_a_monthly_cron_envelope_stops_at_its_cap_and_starts_again_next_month(
    sqlite_rt: Runtime, stub: StubBroker
) -> None:
    from shared.engine import commands

    _envelope(sqlite_rt, 0.1, scope="cron", key="cron_1", period="month")
    spec = _spender(8, 3, PRICED, 100)
    req = commands.RunInput(agent=spec, input="go", cron_id="cron_1")
    first, _ = commands.submit_run(sqlite_rt, req)
    stub.drain(sqlite_rt)
    assert run(sqlite_rt, first["id"])["status"] == "waiting"
    envelope = _envelope_row(sqlite_rt, "cron", "cron_1")
    assert 0 < envelope.spent <= 0.1 + 1e-9
    rounds_before = run(sqlite_rt, first["id"])["round"]
    next_month = period_window(run_store.now(), "month", "UTC").end + 60
    with mock.patch.object(run_store, "now", lambda: next_month):
        reap(sqlite_rt)  # its wake_at (the period's end) has passed: the round is queued
        stub.drain(sqlite_rt)
        again = run(sqlite_rt, first["id"])
        envelope = _envelope_row(sqlite_rt, "cron", "cron_1")
    assert again["round"] > rounds_before  # it spends again in the new period
    assert envelope.period_start >= next_month - 60 and 0 < envelope.spent <= 0.1 + 1e-9


def test_a_call_no_period_can_afford_fails_the_run(sqlite_rt: Runtime, stub: StubBroker) -> None:
    _envelope(sqlite_rt, 0.001)
    run_id = submit(sqlite_rt, _spender(1, 5, PRICED, 4000))
    stub.drain(sqlite_rt)
    r = run(sqlite_rt, run_id)
    assert r["status"] == "failed" and r["stop_reason"] == "budget_envelope"
    assert "more than" in r["error"]["message"]


def _usage_rows(rt: Runtime, run_id: str) -> list[Any]:
    with rt.engine.connect() as conn:
        q = sa.select(usage.c.committed, usage.c.estimated, usage.c.cost).where(
            usage.c.run_id == run_id
        )
        return list(conn.execute(q))


def test_a_call_superseded_by_a_steer_is_billed(sqlite_rt: Runtime, stub: StubBroker) -> None:
    """A message posted while the round's call is in flight supersedes the round (its commit
    finds the run moved): the call is still in ``/usage`` and in the run's cost."""
    import threading
    import time

    from shared.engine import lifecycle

    replies = [{"sleep": 0.6, "text": WORDS}, {"text": "after the steer"}]
    run_id = submit(sqlite_rt, agent(replies, model_extra={"pricing": PRICED}))
    first = stub.pop()
    assert first is not None
    worker = threading.Thread(target=stub.deliver, args=(sqlite_rt, first))
    worker.start()
    time.sleep(0.2)  # the call is in flight
    lifecycle.steer_run(sqlite_rt, lifecycle.Actor("default"), run_id, "also: be brief")
    worker.join()
    stub.drain(sqlite_rt)
    done = run(sqlite_rt, run_id)
    rows = _usage_rows(sqlite_rt, run_id)
    assert done["status"] == "completed"
    lost = [r for r in rows if not r.committed]
    assert len(lost) == 1 and lost[0].cost > 0
    assert done["cost"] == pytest.approx(sum(r.cost for r in rows))


def test_a_cancelled_call_is_billed(sqlite_rt: Runtime, stub: StubBroker) -> None:
    import threading
    import time

    from shared.engine import commands

    run_id = submit(
        sqlite_rt, agent([{"sleep": 5, "text": WORDS}], model_extra={"pricing": PRICED})
    )
    first = stub.pop()
    assert first is not None
    worker = threading.Thread(target=stub.deliver, args=(sqlite_rt, first))
    worker.start()
    time.sleep(0.3)
    commands.cancel_run(sqlite_rt, "default", run_id)
    worker.join(10)
    assert not worker.is_alive()
    done = run(sqlite_rt, run_id)
    rows = _usage_rows(sqlite_rt, run_id)
    assert done["status"] == "cancelled" and len(rows) == 1 and rows[0].estimated
    assert done["cost"] == pytest.approx(rows[0].cost) and rows[0].cost > 0
