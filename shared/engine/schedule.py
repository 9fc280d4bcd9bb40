"""Runs that start later: scheduled runs and crons, released by the reaper from the database.

**Scheduled runs** (``run_at`` / ``delay_s``): a run created ``scheduled`` with ``wake_at`` set
holds no broker message. When its time comes the reaper's pass moves it to ``queued`` and
dispatches its first round — the same transition a new run's first dispatch goes through
(``Change(queue_round=True)``, guarded by the run's version: two reapers release it once).

**Crons**: each cron has a ``next_fire`` time. A pass fires every due cron's *latest* slot not
after now, once: the transaction that creates the slot's run first inserts
``cron_fires(cron_id, slot)``; a concurrent process inserting the same slot waits for it and
then conflicts, and fires nothing. After downtime, the missed slots are not replayed: the
latest one fires once, then the cron continues from now (documented in the README).

A pass fires at most ``TREADLE_CRON_FIRES_PER_PASS`` slots, taken tenant by tenant in turn
(``store.due_crons``): one tenant's thousand due crons wait for later passes, another tenant's
one fires in this one. A fire is a new run like any other: it passes the tenant's limit on runs
in flight and the submissions per minute of the key that made the cron
(``shared.engine.quotas``); refused, the slot does not fire (a warning is logged) and the cron
goes on at its next one. Its spec meets the tenant's spec policy again at each fire (the
policy in force then, ``shared.engine.spec_policy``): a spec the policy now refuses pauses
the cron. A tenant has at most ``TREADLE_MAX_CRONS`` crons, none firing more often than every
``TREADLE_CRON_MIN_INTERVAL_S``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from cronsim import CronSim, CronSimError
from pydantic import ValidationError

from shared.agent.spec import AgentSpec
from shared.engine import admission, commands, quotas, spec_policy
from shared.engine.change import Change
from shared.engine.runtime import Runtime
from shared.engine.transition import attempt
from shared.engine.tx import Tx
from shared.errors import Forbidden, NotFound, QuotaExceeded, SpecError, TreadleError
from shared.store import runs as run_store
from shared.store import schedules as store
from shared.store import threads as thread_store
from shared.store.db import reading
from shared.store.rows import Status
from shared.vocab import EventType

__all__ = [
    "AlreadyFired",
    "CRON_PATTERN",
    "TIMEZONES",
    "check_schedule",
    "create_cron",
    "delete_cron",
    "fire_crons",
    "latest_slot",
    "next_slot",
    "pause_cron",
    "release_due",
    "tick",
]

log = logging.getLogger("treadle.schedule")

_MINUTE = r"(?:[0-5]?[0-9])"
_HOUR = r"(?:[01]?[0-9]|2[0-3])"
_DOM = r"(?:0?[1-9]|[12][0-9]|3[01])"
_MONTH = r"(?:0?[1-9]|1[0-2]|JAN|FEB|MAR|APR|MAY|JUN|JUL|AUG|SEP|OCT|NOV|DEC)"
_DOW = r"(?:[0-7]|SUN|MON|TUE|WED|THU|FRI|SAT)"


def _field(value: str) -> str:
    item = rf"(?:\*|{value}(?:-{value})?)(?:/[1-9][0-9]?)?"
    return rf"{item}(?:,{item}){{0,19}}"


CRON_PATTERN = (
    rf"^{_field(_MINUTE)} {_field(_HOUR)} {_field(_DOM)} {_field(_MONTH)} {_field(_DOW)}$"
)
"""Five cron fields (minute hour day-of-month month day-of-week) separated by one space:
numbers, ``*``, ranges ``a-b``, steps ``/n``, lists ``a,b``; month and weekday names."""
TIMEZONES = sorted(available_timezones())


def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise SpecError(f"unknown timezone {name!r}") from exc


def check_schedule(schedule: str, timezone: str, min_interval: float = 60.0) -> float:
    """A cron expression and timezone, checked (SpecError; also for a schedule with two slots
    closer than ``min_interval`` seconds); returns the first slot from now."""
    zone = _zone(timezone)
    if len(schedule.split()) != 5:
        raise SpecError("schedule: a cron expression has five fields")
    try:
        first = next_slot(schedule, zone, run_store.now())
        gap = shortest_gap(schedule, zone, first, min_interval)
    except (CronSimError, StopIteration) as exc:
        raise SpecError(f"schedule: invalid cron expression {schedule!r} ({exc})") from exc
    if gap < min_interval:
        raise SpecError(
            f"schedule: {schedule!r} fires {gap:g}s apart; a cron fires at most every "
            f"{min_interval:g}s (TREADLE_CRON_MIN_INTERVAL_S)"
        )
    return first


_GAP_SLOTS = 20_000  # slots looked at for the shortest gap (a year of a sparse schedule)


def shortest_gap(schedule: str, zone: ZoneInfo, start: float, floor: float) -> float:
    """The shortest time between two slots within a year of ``start`` (a minute, the finest
    a cron can do, ends the search; so does a gap under ``floor``: it is refused anyway)."""
    if floor <= 60:
        return floor
    slots = CronSim(schedule, datetime.fromtimestamp(int(start) - 1, zone))
    last, shortest, until = next(slots).timestamp(), float("inf"), start + 366 * 86_400
    for _, when in zip(range(_GAP_SLOTS), slots, strict=False):
        ts = when.timestamp()
        shortest = min(shortest, ts - last)
        if shortest < floor or ts > until:
            break
        last = ts
    return shortest


def next_slot(schedule: str, zone: ZoneInfo | str, after: float) -> float:
    """The first slot strictly after ``after`` (epoch seconds)."""
    tz = _zone(zone) if isinstance(zone, str) else zone
    return next(CronSim(schedule, datetime.fromtimestamp(int(after), tz))).timestamp()


def latest_slot(schedule: str, zone: ZoneInfo | str, ts: float) -> float:
    """The last slot at or before ``ts``."""
    tz = _zone(zone) if isinstance(zone, str) else zone
    start = datetime.fromtimestamp(int(ts), tz) + timedelta(seconds=1)
    return next(CronSim(schedule, start, reverse=True)).timestamp()


class AlreadyFired(Exception):  # noqa: N818 - control flow: the slot is another process's
    """Another process fired this slot (its ``cron_fires`` row exists)."""


# --- the reaper's call ---------------------------------------------------------------------


def tick(rt: Runtime, now: float | None = None) -> int:
    """One pass: release the scheduled runs that are due, fire the crons that are due."""
    return release_due(rt, now) + fire_crons(rt, now)


def release_due(rt: Runtime, now: float | None = None, limit: int = 200) -> int:
    """Scheduled runs whose time came: queued and dispatched."""
    with reading(rt.engine) as conn:
        due = store.due_scheduled(conn, run_store.now() if now is None else now, limit)
    released = 0
    for run_id in due:
        released += bool(attempt(rt, _releaser(run_id)))
    return released


def _releaser(run_id: str) -> Callable[[Tx], bool]:
    return lambda tx: _release(tx, run_id)


def _release(tx: Tx, run_id: str) -> bool:
    run = run_store.load_run(tx.conn, run_id)
    if run is None or run.status != Status.SCHEDULED:
        return False  # cancelled meanwhile, or another reaper released it
    gated = run.parent_run_id is None and admission.gate(tx, run.tenant)
    change = Change(run, queue_round=not gated, guard={"status": Status.SCHEDULED.value})
    change.values.update(status=Status.QUEUED.value, wake_at=None, held=gated)
    change.event(EventType.RUN_RELEASED, scheduled=True)
    tx.apply(change)
    return True


def fire_crons(rt: Runtime, now: float | None = None, limit: int | None = None) -> int:
    """Fire each due cron's latest slot once (fleet-wide), at most ``limit`` (default
    ``TREADLE_CRON_FIRES_PER_PASS``), tenant by tenant in turn; returns the runs created
    here."""
    ts = run_store.now() if now is None else now
    with reading(rt.engine) as conn:
        due = store.due_crons(conn, ts, limit or rt.settings.cron_fires_per_pass)
    return sum(1 for cron in due if _fire(rt, cron, ts))


def _refused(rt: Runtime, cron: store.Cron) -> quotas.Refusal | None:
    """Why the tenant may not start a run now (its runs in flight, its creator key's rate)."""
    key = str((cron.options or {}).get("limit_key") or f"tenant:{cron.tenant}")
    return quotas.in_flight(rt, cron.tenant) or quotas.rate(rt, key)


def _fire(rt: Runtime, cron: store.Cron, ts: float) -> bool:
    try:
        slot = latest_slot(cron.schedule, cron.timezone, ts)
        following = next_slot(cron.schedule, cron.timezone, ts)
    except (TreadleError, CronSimError, StopIteration):
        log.warning("cron %s: schedule %r no longer valid; paused", cron.id, cron.schedule)
        _advance(rt, cron.id, None, ts)
        return False
    if cron.last_slot is not None and slot <= cron.last_slot:
        _advance(rt, cron.id, following, ts)  # this slot already fired
        return False
    if (why := _policy_refusal(rt, cron)) is not None:
        log.warning("cron %s: paused: the spec policy refuses its spec now: %s", cron.id, why)
        _advance(rt, cron.id, None, ts)
        return False
    if (refused := _refused(rt, cron)) is not None:
        log.warning("cron %s: slot %s not fired: %s", cron.id, _iso(slot), refused.message)
        _advance(rt, cron.id, following, ts)
        return False
    try:
        record, _ = commands.submit_run(rt, _run_input(cron, slot), also=_claim(cron, slot))
    except AlreadyFired:
        return False
    except (TreadleError, ValidationError) as exc:  # its thread is busy (reject) or gone, ...
        log.warning("cron %s: slot %s not fired: %s", cron.id, _iso(slot), exc)
        _advance(rt, cron.id, following, ts)
        return False
    with rt.engine.begin() as conn:
        store.set_next(conn, cron.id, following, ts, slot=slot, run_id=record.run.id)
    return True


def _policy_refusal(rt: Runtime, cron: store.Cron) -> str | None:
    """Why the spec policy refuses the cron's spec now (its tenant's parts, stored when it was
    made; None: allowed, or an operator's agent)."""
    policed = cron.agent.get("policed")
    if not isinstance(policed, dict):
        return None
    keyed = bool((cron.options or {}).get("keyed", True))
    try:
        spec = AgentSpec.model_validate(policed)
        spec_policy.police(rt.settings, rt.profiles, spec, keyed=keyed)
    except (SpecError, Forbidden, ValidationError) as exc:
        return str(exc)
    return None


def _claim(cron: store.Cron, slot: float) -> Callable[[Tx, str], None]:
    def claim(tx: Tx, _run_id: str) -> None:
        if not store.claim_slot(tx.conn, cron.id, slot, tx.ts):
            raise AlreadyFired(f"{cron.id}@{slot}")

    return claim


def _advance(rt: Runtime, cron_id: str, next_fire: float | None, ts: float) -> None:
    with rt.engine.begin() as conn:
        store.set_next(conn, cron_id, next_fire, ts)


def _run_input(cron: store.Cron, slot: float) -> commands.RunInput:
    options: dict[str, Any] = dict(cron.options or {})
    meta = {**(cron.meta or {}), "cron_id": cron.id, "cron_slot": _iso(slot)}
    return commands.RunInput(
        agent=AgentSpec.model_validate(cron.agent["spec"]),
        agent_ref=cron.agent.get("ref"),
        input=cron.input,
        tenant=cron.tenant,
        thread_id=cron.thread_id,
        metadata=meta,
        cron_id=cron.id,
        priority=int(options.get("priority", 5)),
        ttl_s=options.get("ttl_s"),
    )


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


# --- crons over the API ----------------------------------------------------------------------


def create_cron(
    rt: Runtime,
    row: dict[str, Any],
    *,
    tenant: str,
) -> store.Cron:
    """A new cron (``row``: the ``crons`` columns but times); checks the schedule, the timezone
    (SpecError), the tenant's quota (QuotaExceeded) and the thread (NotFound) first: a refused
    cron writes nothing."""
    first = check_schedule(row["schedule"], row["timezone"], rt.settings.cron_min_interval_s)
    quota = rt.settings.max_crons
    with rt.engine.begin() as conn:
        if quota and store.count_crons(conn, tenant) >= quota:
            raise QuotaExceeded(
                f"this tenant has {quota} crons, the most it may have (TREADLE_MAX_CRONS)"
            )
        if row.get("thread_id") and not thread_store.get_thread(conn, row["thread_id"], tenant):
            raise NotFound(f"thread {row['thread_id']} not found")
        values = {**row, "id": commands.new_id("cron"), "tenant": tenant, "next_fire": first}
        return store.insert_cron(conn, values, run_store.now())


def pause_cron(rt: Runtime, tenant: str, cron_id: str, paused: bool) -> store.Cron:
    """Pause (no slot fires) or resume (from the next slot after now: slots missed while
    paused never fire)."""
    with rt.engine.begin() as conn:
        cron = store.get_cron(conn, cron_id, tenant)
        if cron is None:
            raise NotFound(f"cron {cron_id} not found")
        ts = run_store.now()
        nxt = None if paused else next_slot(cron.schedule, cron.timezone, ts)
        found = store.set_paused(conn, cron_id, tenant, paused, nxt, ts)
    assert found is not None
    return found


def delete_cron(rt: Runtime, tenant: str, cron_id: str) -> None:
    with rt.engine.begin() as conn:
        if not store.delete_cron(conn, cron_id, tenant):
            raise NotFound(f"cron {cron_id} not found")
