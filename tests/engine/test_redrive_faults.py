"""The reaper re-sends what is lost — on time, whatever its queue holds — and never what
still waits in its queue; it counts what it does; a live worker gives back the leases none
of its threads works on."""

from __future__ import annotations

import dataclasses

import sqlalchemy as sa
from prometheus_client import REGISTRY

from shared.engine.reaper import reap
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.names import REAP_TASK, REAPER_QUEUE, ROUNDS_QUEUE, TASK_QUEUES, TOOLS_QUEUE
from shared.store import runs as run_store
from shared.store.tables import runs
from tests.engine.helpers import agent, submit


def _counter(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _age(rt: Runtime, run_id: str, seconds: float) -> None:
    """As if the run's round had been due, and its dispatch out, for ``seconds``."""
    with rt.engine.begin() as conn:
        conn.execute(
            sa.update(runs)
            .where(runs.c.id == run_id)
            .values(
                updated_at=runs.c.updated_at - seconds,
                dispatched_at=runs.c.dispatched_at - seconds,
            )
        )


def _sent(rt: Runtime, run_id: str) -> float:
    with rt.engine.connect() as conn:
        return float(
            conn.execute(sa.select(runs.c.dispatched_at).where(runs.c.id == run_id)).scalar_one()
        )


def _took(rt: Runtime, queue: str, priority: int, sent: float) -> None:
    """A worker took a dispatch sent at ``sent`` from ``queue`` (its heartbeat says so)."""
    hb = rt.heartbeat
    hb.owner()  # registered
    hb.received(queue, priority, sent)
    assert hb.beat(rt.engine)


def _lost_round(rt: Runtime, stub: StubBroker) -> str:
    run_id = submit(rt, agent([{"text": "done"}]))
    stub.queue.clear()  # the round's message is lost
    return run_id


def test_the_reaper_has_its_own_queue() -> None:
    assert TASK_QUEUES[REAP_TASK] == REAPER_QUEUE not in (ROUNDS_QUEUE, TOOLS_QUEUE)


def test_no_resend_while_the_queue_holds_messages(sqlite_rt: Runtime, stub: StubBroker) -> None:
    run_id = _lost_round(sqlite_rt, stub)
    _age(sqlite_rt, run_id, 20)
    backlog = dataclasses.replace(sqlite_rt, queue_depth=lambda: {ROUNDS_QUEUE: 40})
    assert reap(backlog).resent == 0 and not stub.queue  # plausibly waiting in the queue
    before = _counter("treadle_reaper_redrives_total", what="round")
    drained = dataclasses.replace(sqlite_rt, queue_depth=lambda: {ROUNDS_QUEUE: 0})
    assert reap(drained).resent == 1 and stub.queue[0].run_id == run_id
    assert _counter("treadle_reaper_redrives_total", what="round") == before + 1
    stub.drain(sqlite_rt)
    with sqlite_rt.engine.connect() as conn:
        assert run_store.load_run(conn, run_id).status.value == "completed"  # type: ignore[union-attr]


def test_a_lost_dispatch_is_resent_on_time_behind_a_backlog(
    sqlite_rt: Runtime, stub: StubBroker
) -> None:
    """A deep queue does not hide a loss: once a worker took a dispatch sent after the lost
    one (same queue, same priority), the lost one is re-sent at its re-drive time."""
    run_id = _lost_round(sqlite_rt, stub)
    _age(sqlite_rt, run_id, sqlite_rt.settings.redrive_seconds + 1)
    sent = _sent(sqlite_rt, run_id)
    backlog = dataclasses.replace(sqlite_rt, queue_depth=lambda: {ROUNDS_QUEUE: 500})
    assert reap(backlog).resent == 0  # nothing sent after it was taken: plausibly queued
    _took(sqlite_rt, ROUNDS_QUEUE, 9, sent + 1)  # another priority proves nothing
    assert reap(backlog).resent == 0
    _took(sqlite_rt, TOOLS_QUEUE, 5, sent + 1)  # nor another queue
    assert reap(backlog).resent == 0
    _took(sqlite_rt, ROUNDS_QUEUE, 5, sent + 0.5)  # one sent after it was taken: it is lost
    assert reap(backlog).resent == 1 and stub.queue[0].run_id == run_id
    stub.drain(sqlite_rt)
    with sqlite_rt.engine.connect() as conn:
        assert run_store.load_run(conn, run_id).status.value == "completed"  # type: ignore[union-attr]


def test_resends_follow_the_redrive_interval_then_back_off(
    sqlite_rt: Runtime, stub: StubBroker
) -> None:
    """Each re-send waits one re-drive interval from the last; a dispatch re-sent
    ``BACKOFF_FREE`` times and still never claimed (a bug, not a loss) backs off."""
    from shared.store.redrive import BACKOFF_FREE

    run_id = _lost_round(sqlite_rt, stub)
    wait = sqlite_rt.settings.redrive_seconds
    resent = []
    for _ in range(BACKOFF_FREE + 2):
        _age(sqlite_rt, run_id, wait * 1.1)
        n = reap(sqlite_rt).resent
        stub.queue.clear()  # lost again
        resent.append(n)
    assert resent == [1] * (BACKOFF_FREE + 1) + [0]  # the next one waits twice as long
    _age(sqlite_rt, run_id, wait)
    assert reap(sqlite_rt).resent == 1


def test_a_dead_workers_round_is_resent_despite_a_backlog(
    sqlite_rt: Runtime, stub: StubBroker
) -> None:
    run_id = _lost_round(sqlite_rt, stub)
    with sqlite_rt.engine.begin() as conn:  # claimed by a worker that has since died
        conn.execute(sa.update(runs).where(runs.c.id == run_id).values(lease_owner="gone:1:x"))
    backlog = dataclasses.replace(sqlite_rt, queue_depth=lambda: {ROUNDS_QUEUE: 40})
    assert reap(backlog).resent == 1
    before = _counter("treadle_takeovers_total", what="round")
    stub.drain(sqlite_rt)
    assert _counter("treadle_takeovers_total", what="round") == before + 1


def test_a_stale_delivery_is_counted(sqlite_rt: Runtime, stub: StubBroker) -> None:
    run_id = submit(sqlite_rt, agent([{"text": "done"}]))
    dup = stub.queue[0]
    stub.drain(sqlite_rt)
    before = _counter("treadle_stale_deliveries_total", reason="round")
    assert stub.deliver(sqlite_rt, dup) == "stale"
    assert _counter("treadle_stale_deliveries_total", reason="round") == before + 1
    assert run_id


def test_a_live_worker_gives_back_leases_no_thread_works_on(
    sqlite_rt: Runtime, stub: StubBroker
) -> None:
    idle = _lost_round(sqlite_rt, stub)
    busy = _lost_round(sqlite_rt, stub)
    hb = sqlite_rt.heartbeat
    owner = hb.owner()
    with sqlite_rt.engine.begin() as conn:  # both claimed by this process
        conn.execute(sa.update(runs).where(runs.c.id.in_([idle, busy])).values(lease_owner=owner))
    with hb.working(busy):
        assert hb.sweep(sqlite_rt.engine) == 1
    with sqlite_rt.engine.connect() as conn:
        owners = dict(conn.execute(sa.select(runs.c.id, runs.c.lease_owner)).all())
    assert owners == {idle: None, busy: owner}
    hb.stop()


def test_queue_wait_counts_from_when_the_round_became_due(
    sqlite_rt: Runtime, stub: StubBroker
) -> None:
    run_id = _lost_round(sqlite_rt, stub)
    _age(sqlite_rt, run_id, 75)  # the message waited 75 s behind a backlog
    before = _counter("treadle_round_seconds_sum", phase="queue_wait")
    reap(sqlite_rt)  # the re-send does not restart the wait
    stub.drain(sqlite_rt)
    waited = _counter("treadle_round_seconds_sum", phase="queue_wait") - before
    assert 75 <= waited < 80


def test_an_unreachable_fleet_limiter_follows_the_setting(
    sqlite_rt: Runtime, stub: StubBroker
) -> None:
    """Redis down under a profile's fleet-wide limits: ``open`` calls the model without them,
    ``closed`` gives the round back to try again later (no failure either way)."""
    from shared.llm.ratelimit import RedisLimiter

    down = RedisLimiter("redis://127.0.0.1:9/0")
    spec = agent([{"text": "done"}], model_extra={"requests_per_minute": 60})
    closed = dataclasses.replace(
        sqlite_rt,
        limiter=down,
        settings=sqlite_rt.settings.model_copy(update={"limiter_on_failure": "closed"}),
    )
    run_id = submit(closed, spec)
    assert stub.deliver(closed, stub.pop()) == "retry"  # type: ignore[arg-type]
    assert stub.retries == [5.0]
    opened = dataclasses.replace(sqlite_rt, limiter=down)  # the default: open
    stub.drain(opened)
    with sqlite_rt.engine.connect() as conn:
        assert run_store.load_run(conn, run_id).status.value == "completed"  # type: ignore[union-attr]


def test_a_commit_behind_a_held_row_is_tried_again_then_given_up() -> None:
    import pytest
    from sqlalchemy.exc import OperationalError

    from shared.engine.busy import when_free

    class Busy(Exception):
        sqlstate = "55P03"  # lock_not_available

    calls: list[int] = []

    def held_twice() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise OperationalError("UPDATE runs", {}, Busy())
        return "committed"

    assert when_free(held_twice, "a round") == "committed" and len(calls) == 3
    calls.clear()

    def held() -> str:
        calls.append(1)
        raise OperationalError("UPDATE runs", {}, Busy())

    with pytest.raises(OperationalError):
        when_free(held, "a round", tries=2)
    assert len(calls) == 2
