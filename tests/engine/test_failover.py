"""Durable model failover (docs/cost.md), through the fake OpenAI-compatible server over
HTTP: a primary that fails past its retries (a 500 storm, then a dead port) hands the run's
next round to its fallback, recorded in the run's loop state, its events and each call's
``/usage`` row; after the cool-down the primary serves again."""

from __future__ import annotations

from dataclasses import replace
from typing import Any
from unittest import mock

import sqlalchemy as sa

from shared.agent.spec import AgentSpec, ModelProfile
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.llm.fake_server import FakeLLMServer
from shared.store import runs as run_store
from shared.store.tables import events, usage
from tests.engine.helpers import run, submit
from tests.support import RoundsModel

DEAD = "http://127.0.0.1:9/v1"  # nothing listens on the discard port


def _profile(base_url: str, name: str, **extra: Any) -> ModelProfile:
    body = {
        "name": name,
        "provider": "openai",
        "base_url": base_url,
        "model": f"{name}-model",
        "max_retries": 1,
        "timeout_connect": 1.0,
        **extra,
    }
    return ModelProfile.model_validate(body).as_operator()


def _agent(**spec: Any) -> AgentSpec:
    return AgentSpec.model_validate(
        {"kind": "agent", "model": "primary", "tools": ["echo"], "max_rounds": 50, **spec}
    )


def _served(rt: Runtime, run_id: str) -> list[tuple[str, bool]]:
    with rt.engine.connect() as conn:
        q = sa.select(usage.c.profile, usage.c.committed).where(usage.c.run_id == run_id)
        return [(str(p), bool(c)) for p, c in conn.execute(q.order_by(usage.c.id))]


def _failovers(rt: Runtime, run_id: str) -> list[dict[str, Any]]:
    with rt.engine.connect() as conn:
        q = sa.select(events.c.data).where(
            events.c.run_id == run_id, events.c.type == "model.failover"
        )
        return [dict(d) for d in conn.execute(q).scalars()]


def _rt(sqlite_rt: Runtime, primary_url: str, backup_url: str, **primary: Any) -> Runtime:
    extra = {"fallback": ["backup"], "failover_cooldown_s": 60.0, **primary}
    return replace(
        sqlite_rt,
        profiles={
            "primary": _profile(primary_url, "primary", **extra),
            "backup": _profile(backup_url, "backup"),
        },
    )


def test_a_failing_primary_hands_the_run_to_its_fallback(
    stub: StubBroker, sqlite_rt: Runtime
) -> None:
    with FakeLLMServer() as primary, FakeLLMServer() as backup:
        primary.responder, backup.responder = RoundsModel(4), RoundsModel(4)
        primary.responder.down, primary.responder.down_from = True, 2  # a 500 storm
        rt = _rt(sqlite_rt, primary.base_url, backup.base_url)
        run_id = submit(rt, _agent())
        stub.drain(rt)
        done = run(rt, run_id)
    assert done["status"] == "completed", done["error"]
    served = [p for p, committed in _served(rt, run_id) if committed]
    assert served == ["primary", "backup", "backup", "backup"]
    (moved,) = _failovers(rt, run_id)
    assert moved["failed"] == "primary" and moved["serving"] == "backup"
    assert done["loop"]["profile_index"] == 1


def test_a_dead_primary_port_fails_over_too(stub: StubBroker, sqlite_rt: Runtime) -> None:
    with FakeLLMServer() as backup:
        backup.responder = RoundsModel(3)
        rt = _rt(sqlite_rt, DEAD, backup.base_url)
        run_id = submit(rt, _agent())
        stub.drain(rt)
        done = run(rt, run_id)
    assert done["status"] == "completed", done["error"]
    assert {p for p, c in _served(rt, run_id) if c} == {"backup"}


def test_after_the_cool_down_the_primary_serves_again(stub: StubBroker, sqlite_rt: Runtime) -> None:
    with FakeLLMServer() as primary, FakeLLMServer() as backup:
        primary.responder, backup.responder = RoundsModel(6), RoundsModel(6)
        primary.responder.down, primary.responder.down_from = True, 1
        rt = _rt(sqlite_rt, primary.base_url, backup.base_url)
        run_id = submit(rt, _agent())
        for _ in range(4):  # the failed primary round, the failover, two backup rounds
            d = stub.pop()
            assert d is not None
            stub.deliver(rt, d)
        assert {p for p, c in _served(rt, run_id) if c} == {"backup"}
        primary.responder.down = False  # the primary is back; its cool-down passes
        later = run_store.now() + 61
        with mock.patch.object(run_store, "now", lambda: later):
            stub.drain(rt)
        done = run(rt, run_id)
    assert done["status"] == "completed", done["error"]
    served = [p for p, c in _served(rt, run_id) if c]
    assert served[-1] == "primary" and "backup" in served
    assert done["loop"]["profile_index"] == 0


def test_an_exhausted_chain_waits_out_the_outage(stub: StubBroker, sqlite_rt: Runtime) -> None:
    rt = _rt(sqlite_rt, DEAD, DEAD)
    run_id = submit(rt, _agent(provider_wait_s=600))
    stub.drain(rt)
    waiting = run(rt, run_id)
    assert waiting["status"] == "waiting" and waiting["pending"]["kind"] == "provider"
    assert len(_failovers(rt, run_id)) == 1
