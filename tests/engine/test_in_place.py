"""Rounds driven in place (``shared.engine.round.rounds_in_place``): a task whose commit makes
its run's next round due at once drives that round itself instead of publishing it, for as long
as the worker lets it; what it does not drive is published, and a failure hands the round to
the broker. The run's transcript is the same either way."""

from __future__ import annotations

import pytest

from shared.engine.round import rounds_in_place, run_round
from shared.engine.runtime import Dispatch, Runtime
from shared.engine.testing import StubBroker
from tests.engine.helpers import agent, call, run, submit, transcript


def _calc_agent(rounds: int) -> object:
    replies = [
        {"tool_calls": [call("calculator", {"expression": f"{k}+1"})]} for k in range(rounds)
    ]
    return agent([*replies, {"text": "done"}])


def _rounds(sent: list[Dispatch], run_id: str) -> list[Dispatch]:
    return [d for d in sent if d.kind == "round" and d.run_id == run_id]


def _first(stub: StubBroker, run_id: str) -> Dispatch:
    d = stub.pop()
    assert d is not None and d.kind == "round" and d.run_id == run_id
    return d


def test_a_run_of_quick_tool_rounds_is_driven_in_one_task(
    sqlite_rt: Runtime, stub: StubBroker
) -> None:
    run_id = submit(sqlite_rt, _calc_agent(3))
    d = _first(stub, run_id)
    before = len(_rounds(stub.sent, run_id))
    with rounds_in_place(sqlite_rt, run_id, lambda n: True) as here:
        run_round(here, run_id, d.version, d.attempt)
    assert run(sqlite_rt, run_id)["status"] == "completed"
    assert len(_rounds(stub.sent, run_id)) == before  # no round went through the broker
    roles = [role for role, _, _ in transcript(sqlite_rt, run_id)]
    assert roles == ["user", *["assistant", "tool"] * 3, "assistant"]


def test_what_the_task_does_not_drive_is_published(sqlite_rt: Runtime, stub: StubBroker) -> None:
    run_id = submit(sqlite_rt, _calc_agent(3))
    d = _first(stub, run_id)
    with rounds_in_place(sqlite_rt, run_id, lambda n: n < 1) as here:  # one more, then stop
        run_round(here, run_id, d.version, d.attempt)
    assert run(sqlite_rt, run_id)["status"] == "running"
    left = stub.pop()
    assert (
        left is not None
        and left.kind == "round"
        and left.version == run(sqlite_rt, run_id)["version"]
    )
    stub.deliver(sqlite_rt, left)
    stub.drain(sqlite_rt)
    assert run(sqlite_rt, run_id)["status"] == "completed"
    assert [r for r, _, _ in transcript(sqlite_rt, run_id)].count("tool") == 3


def test_a_round_that_fails_in_place_goes_to_the_broker(
    sqlite_rt: Runtime, stub: StubBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shared.engine import round as round_mod

    run_id = submit(sqlite_rt, _calc_agent(2))
    d = _first(stub, run_id)
    real, calls = round_mod.run_round, []

    def flaky(rt: Runtime, rid: str, version: int, attempt_no: int = 0) -> object:
        calls.append(version)
        if len(calls) == 2:
            raise RuntimeError("database went away")
        return real(rt, rid, version, attempt_no)

    monkeypatch.setattr(round_mod, "run_round", flaky)
    with pytest.raises(RuntimeError), rounds_in_place(sqlite_rt, run_id, lambda n: True) as here:
        real(here, run_id, d.version, d.attempt)
    handed = stub.pop()
    assert handed is not None and handed.kind == "round" and handed.version == calls[1]
    monkeypatch.setattr(round_mod, "run_round", real)
    stub.deliver(sqlite_rt, handed)
    stub.drain(sqlite_rt)
    assert run(sqlite_rt, run_id)["status"] == "completed"


def test_the_hand_off_holds_one_due_round_of_its_run_only(sqlite_rt: Runtime) -> None:
    """The hand-off is a publisher the block installs on the runtime it yields: nothing
    thread-local, and the caller's runtime publishes as ever."""
    from dataclasses import replace

    published: list[Dispatch] = []
    rt = replace(sqlite_rt, publish=published.extend)
    mine, other = Dispatch.round("r1", 3), Dispatch.round("r2", 1)
    later, tool = Dispatch.round("r1", 4, countdown=5.0), Dispatch.tool("r1", "c1", 3)
    with rounds_in_place(rt, "r1", lambda n: False) as here:
        here.publish([other, later, tool, mine])
        assert published == [other, later, tool]  # a countdown is not "due at once"
        here.publish([Dispatch.round("r1", 9)])  # one round is held at a time
        assert published[-1] == Dispatch.round("r1", 9)
        rt.publish([Dispatch.round("r1", 10)])  # the caller's runtime holds nothing
        assert published[-1] == Dispatch.round("r1", 10)
    assert published[-1] == mine  # not driven here (``more`` said no): published at the end
