"""Scheduled runs and crons on SQLite and the stub broker, with a fake clock: a scheduled run
holds no dispatch until the reaper's pass at its time; a cron fires each slot once, and after
downtime only the latest missed slot."""

from __future__ import annotations

from datetime import UTC, datetime

from shared.engine import commands, schedule
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.store import runs as run_store
from shared.store import schedules as store
from shared.store.tables import crons
from tests.engine.helpers import agent, run

SPEC = agent([{"text": "done"}])


def _scheduled(rt: Runtime, at: float) -> str:
    row, _ = commands.submit_run(rt, commands.RunInput(agent=SPEC, input="go", run_at=at))
    return str(row["id"])


def test_a_scheduled_run_waits_for_its_time_then_runs(sqlite_rt: Runtime, stub: StubBroker) -> None:
    now = run_store.now()
    run_id = _scheduled(sqlite_rt, now + 60)
    assert run(sqlite_rt, run_id)["status"] == "scheduled"
    assert stub.sent == []  # no broker message while scheduled
    assert schedule.release_due(sqlite_rt, now + 30) == 0
    assert stub.sent == []
    assert schedule.release_due(sqlite_rt, now + 61) == 1
    assert schedule.release_due(sqlite_rt, now + 62) == 0  # released once
    assert [d.kind for d in stub.sent] == ["round"]
    stub.drain(sqlite_rt)
    assert run(sqlite_rt, run_id)["status"] == "completed"


def test_a_scheduled_run_can_be_cancelled(sqlite_rt: Runtime, stub: StubBroker) -> None:
    run_id = _scheduled(sqlite_rt, run_store.now() + 60)
    assert commands.cancel_run(sqlite_rt, "default", run_id)["status"] == "cancelled"
    assert schedule.release_due(sqlite_rt, run_store.now() + 120) == 0
    assert stub.sent == []


def _cron(rt: Runtime, expr: str = "* * * * *", tz: str = "UTC") -> str:
    first = schedule.check_schedule(expr, tz)
    row = {
        "id": commands.new_id("cron"),
        "tenant": "default",
        "agent": {"spec": SPEC.model_dump(mode="json", exclude_none=True), "ref": None},
        "input": "tick",
        "schedule": expr,
        "timezone": tz,
        "next_fire": first,
    }
    with rt.engine.begin() as conn:
        return store.insert_cron(conn, row, run_store.now()).id


def _fired(rt: Runtime, cron_id: str) -> int:
    with rt.engine.connect() as conn:
        runs = run_store.list_runs(conn, "default", limit=1000)
    return sum(1 for r in runs if (r["meta"] or {}).get("cron_id") == cron_id)


def test_a_cron_fires_each_slot_once(sqlite_rt: Runtime, stub: StubBroker) -> None:
    cron_id = _cron(sqlite_rt)
    with sqlite_rt.engine.connect() as conn:
        first = store.get_cron(conn, cron_id)
    assert first is not None and first.next_fire is not None
    t = first.next_fire
    assert schedule.fire_crons(sqlite_rt, t - 1) == 0
    assert schedule.fire_crons(sqlite_rt, t + 1) == 1
    assert schedule.fire_crons(sqlite_rt, t + 2) == 0  # same slot
    assert schedule.fire_crons(sqlite_rt, t + 61) == 1  # the next minute
    assert _fired(sqlite_rt, cron_id) == 2
    # down for five minutes: one catch-up run, for the latest slot
    assert schedule.fire_crons(sqlite_rt, t + 60 * 6 + 5) == 1
    assert schedule.fire_crons(sqlite_rt, t + 60 * 6 + 10) == 0
    assert _fired(sqlite_rt, cron_id) == 3
    with sqlite_rt.engine.connect() as conn:
        cron = store.get_cron(conn, cron_id)
    assert cron is not None and cron.last_slot == t + 360 and cron.next_fire == t + 420


def test_slots_follow_the_timezone() -> None:
    # 09:00 in Berlin is 08:00 UTC in winter, 07:00 UTC in summer
    winter = datetime(2026, 1, 10, 12, tzinfo=UTC).timestamp()
    summer = datetime(2026, 7, 10, 12, tzinfo=UTC).timestamp()
    assert (
        datetime.fromtimestamp(schedule.latest_slot("0 9 * * *", "Europe/Berlin", winter), UTC).hour
        == 8
    )
    assert (
        datetime.fromtimestamp(schedule.latest_slot("0 9 * * *", "Europe/Berlin", summer), UTC).hour
        == 7
    )


def test_the_schedule_pattern_and_checks() -> None:
    import re

    for ok in ("* * * * *", "*/5 0-6 1,15 JAN-MAR MON-FRI", "0 9 * * 1"):
        assert re.match(schedule.CRON_PATTERN, ok), ok
        schedule.check_schedule(ok, "UTC")
    for bad in ("* * * *", "60 * * * *", "* * * * * *", "@daily", "*/0 * * * *"):
        assert not re.match(schedule.CRON_PATTERN, bad), bad


def test_a_slot_whose_run_is_refused_is_skipped(sqlite_rt: Runtime, stub: StubBroker) -> None:
    cron_id = _cron(sqlite_rt)
    with sqlite_rt.engine.begin() as conn:  # its thread is gone: the slot cannot fire
        conn.execute(crons.update().where(crons.c.id == cron_id).values(thread_id="thr_gone"))
    assert schedule.fire_crons(sqlite_rt, 4e9) == 0
    with sqlite_rt.engine.connect() as conn:
        cron = store.get_cron(conn, cron_id)
    assert cron is not None and cron.next_fire is not None and cron.next_fire > 4e9
    assert _fired(sqlite_rt, cron_id) == 0 and stub.sent == []


# --- quotas and fairness ------------------------------------------------------------


def _tenant_crons(rt: Runtime, tenant: str, n: int, first: float) -> list[str]:
    """``n`` every-minute crons of ``tenant``, all due at ``first``, in one transaction."""
    spec = {"spec": SPEC.model_dump(mode="json", exclude_none=True), "ref": None}
    rows = [
        {
            "id": commands.new_id("cron"),
            "tenant": tenant,
            "agent": spec,
            "input": "tick",
            "schedule": "* * * * *",
            "timezone": "UTC",
            "next_fire": first,
            "created_at": run_store.now(),
            "updated_at": run_store.now(),
        }
        for _ in range(n)
    ]
    with rt.engine.begin() as conn:
        conn.execute(crons.insert(), rows)
    return [r["id"] for r in rows]


def _fired_of(rt: Runtime, tenant: str) -> int:
    with rt.engine.connect() as conn:
        runs = run_store.list_runs(conn, tenant, limit=10_000)
    return sum(1 for r in runs if (r["meta"] or {}).get("cron_id"))


def test_a_thousand_crons_of_one_tenant_do_not_delay_anothers(
    sqlite_rt: Runtime, stub: StubBroker
) -> None:
    """One reaper pass fires at most TREADLE_CRON_FIRES_PER_PASS slots, tenant by tenant in
    turn: the other tenant's cron, due last, fires in the first pass (no later than one reaper
    interval), and the greedy tenant's thousand go out over the following passes."""
    t = schedule.check_schedule("* * * * *", "UTC") + 60
    settings = sqlite_rt.settings.model_copy(
        update={"cron_fires_per_pass": 100, "max_runs_in_flight": 0, "submits_per_minute": 0}
    )
    rt = Runtime(engine=sqlite_rt.engine, settings=settings, publish=stub)
    _tenant_crons(rt, "greedy", 1000, t - 30)  # due first
    [victim] = _tenant_crons(rt, "victim", 1, t)
    assert schedule.fire_crons(rt, t + 1) == 100  # one pass: bounded
    assert _fired_of(rt, "victim") == 1  # in the first pass, behind none of the thousand
    assert _fired_of(rt, "greedy") == 99
    with rt.engine.connect() as conn:
        cron = store.get_cron(conn, victim)
    assert cron is not None and cron.last_slot == t


def test_a_crons_fires_count_against_its_tenants_limits(
    sqlite_rt: Runtime, stub: StubBroker
) -> None:
    """A fire is a submission: the tenant's runs in flight and its key's submissions per
    minute; a refused slot does not fire, and the cron goes on at its next slot."""
    t = schedule.check_schedule("* * * * *", "UTC") + 60
    settings = sqlite_rt.settings.model_copy(update={"max_runs_in_flight": 2})
    rt = Runtime(engine=sqlite_rt.engine, settings=settings, publish=stub)
    ids = _tenant_crons(rt, "acme", 3, t)
    assert schedule.fire_crons(rt, t + 1) == 2  # the third would be the third run in flight
    with rt.engine.connect() as conn:
        left = [c for c in (store.get_cron(conn, i) for i in ids) if c and c.last_run_id is None]
    assert len(left) == 1 and left[0].next_fire == t + 60  # skipped, due again next minute
    stub.drain(rt)  # the two runs end: room again
    rated = rt.settings.model_copy(update={"max_runs_in_flight": 0, "submits_per_minute": 1})
    rt = Runtime(engine=rt.engine, settings=rated, publish=stub)
    assert schedule.fire_crons(rt, t + 61) == 1  # one submission a minute for the tenant
    assert _fired_of(rt, "acme") == 3


def test_a_schedule_firing_more_often_than_the_minimum_interval_is_refused() -> None:
    import pytest

    from shared.errors import SpecError

    assert schedule.check_schedule("*/5 * * * *", "UTC", 300) > 0
    for expr in ("* * * * *", "*/4 * * * *", "0,1 9 * * *"):
        with pytest.raises(SpecError, match="TREADLE_CRON_MIN_INTERVAL_S"):
            schedule.check_schedule(expr, "UTC", 300)
    assert schedule.check_schedule("0 9 1 1 *", "UTC", 86_400) > 0  # yearly
