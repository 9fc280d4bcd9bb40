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
