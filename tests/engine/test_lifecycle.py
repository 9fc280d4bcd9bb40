"""Resume, fork, steer and waiting out a provider outage, on SQLite with the stub broker and
the fake model server (strict: a dangling tool call would be a 400). Model requests are
counted at the server."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import sqlalchemy as sa

import tests.plugins  # noqa: F401  (registers the echo tool)
from shared.agent.spec import AgentSpec, ModelProfile
from shared.engine import commands, lifecycle, outage, threads
from shared.engine.reaper import reap
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.errors import Conflict, NotFound
from shared.llm.fake_server import FakeLLMServer
from shared.store import records
from shared.store import runs as run_store
from shared.store.tables import messages, runs
from tests.support import RoundsModel, requests_per_round

ME = lifecycle.Actor("default", "key_test")


@pytest.fixture
def llm() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as server:
        yield server


def _profile(llm: FakeLLMServer, name: str = "inline", **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "provider": "openai",
        "base_url": llm.base_url,
        "model": "m",
        "api_key_env": None,
        "max_retries": 1,
        **extra,
    }


def _agent(model: Any, **spec: Any) -> AgentSpec:
    return AgentSpec.model_validate(
        {"kind": "agent", "tools": ["echo"], "max_rounds": 100, "model": model, **spec}
    )


def _submit(rt: Runtime, spec: AgentSpec, text: str = "go", thread: str | None = None) -> str:
    row, _ = commands.submit_run(rt, commands.RunInput(agent=spec, input=text, thread_id=thread))
    return str(row["id"])


def _run(rt: Runtime, run_id: str) -> Any:
    with rt.engine.connect() as conn:
        record = run_store.get_run(conn, run_id)
    assert record is not None
    return record


def _rows(rt: Runtime, run_id: str | None = None) -> int:
    q = sa.select(sa.func.count()).select_from(messages)
    if run_id is not None:
        q = q.where(messages.c.run_id == run_id)
    with rt.engine.connect() as conn:
        return int(conn.execute(q).scalar_one())


def _roles(rt: Runtime, run_id: str) -> list[str]:
    with rt.engine.connect() as conn:
        return [m["role"] for m in records.list_messages(conn, run_id)]


def _valid_transcript(roles: list[str]) -> None:
    """user, then (assistant, tool)* rounds, then the final assistant."""
    assert roles[0] == "user" and roles[-1] == "assistant", roles
    body = roles[1:-1]
    assert body == ["assistant", "tool"] * (len(body) // 2), roles


# --- a provider outage --------------------------------------------------------------------------


def test_outage_with_no_wait_fails_and_resume_completes_without_repeating(
    sqlite_rt: Runtime, stub: StubBroker, llm: FakeLLMServer
) -> None:
    model = RoundsModel(20)
    model.down, model.down_from = True, 8
    llm.responder = model
    run_id = _submit(sqlite_rt, _agent(_profile(llm), provider_wait_s=0))
    stub.drain(sqlite_rt)
    failed = _run(sqlite_rt, run_id)
    assert failed["status"] == "failed" and failed["error"]["code"] == "model_error"
    assert failed["round"] == 7
    assert requests_per_round(llm)[8] == 2  # the request and its one retry
    model.down = False
    resumed = lifecycle.resume_run(sqlite_rt, ME, run_id)
    assert resumed["status"] == "queued" and resumed["error"] is None
    stub.drain(sqlite_rt)
    done = _run(sqlite_rt, run_id)
    assert done["status"] == "completed" and done["result"]["text"] == "done after 20 rounds"
    counts = requests_per_round(llm)
    assert all(counts[k] == 1 for k in range(1, 8)), counts  # rounds 1-7 not repeated
    assert counts[8] == 3 and all(counts[k] == 1 for k in range(9, 21)), counts
    _valid_transcript(_roles(sqlite_rt, run_id))
    with sqlite_rt.engine.connect() as conn:
        evs = [e for e in records.list_events(conn, run_id) if e["type"] == "run.resumed"]
    assert evs[0]["data"]["by"] == {"tenant": "default", "key_id": "key_test"}
    assert evs[0]["data"]["from_status"] == "failed"


def test_outage_waits_holding_nothing_and_completes_when_the_provider_returns(
    sqlite_rt: Runtime, stub: StubBroker, llm: FakeLLMServer
) -> None:
    model = RoundsModel(12)
    model.down, model.down_from = True, 5
    llm.responder = model
    run_id = _submit(sqlite_rt, _agent(_profile(llm)))
    stub.drain(sqlite_rt)
    waiting = _run(sqlite_rt, run_id)
    assert waiting["status"] == "waiting", waiting["error"]
    pending = waiting["pending"]
    assert pending["kind"] == "provider" and pending["profile"] == "inline"
    assert pending["retry_at"] == waiting["wake_at"] > run_store.now()
    assert not stub.queue and waiting["lease_owner"] is None  # no message, no lease
    assert reap(sqlite_rt).resent == 0 and not stub.queue  # not due yet: nothing re-sent

    _due_now(sqlite_rt, run_id)  # still down: one request, then it waits again, longer
    before = len(llm.bodies)
    reap(sqlite_rt)
    stub.drain(sqlite_rt)
    again = _run(sqlite_rt, run_id)
    assert len(llm.bodies) == before + 1
    assert again["status"] == "waiting" and again["pending"]["tries"] == 2
    assert again["pending"]["since"] == pending["since"]
    assert again["wake_at"] - run_store.now() > outage.retry_delay(sqlite_rt.settings, 1)

    key = pending["key"]  # a fleet-wide pause of the profile: not tried before it ends
    sqlite_rt.limiter.pause(key, 30)
    _due_now(sqlite_rt, run_id)
    reap(sqlite_rt)
    assert not stub.queue and len(llm.bodies) == before + 1
    assert _run(sqlite_rt, run_id)["wake_at"] >= run_store.now() + 25

    model.down = False
    sqlite_rt.limiter.pause(key, 0)
    sqlite_rt.limiter = type(sqlite_rt.limiter)()  # the pause is over
    _due_now(sqlite_rt, run_id)
    reap(sqlite_rt)
    stub.drain(sqlite_rt)
    done = _run(sqlite_rt, run_id)
    assert done["status"] == "completed", done["error"]
    counts = requests_per_round(llm)
    assert all(counts[k] == 1 for k in range(1, 5)), counts
    _valid_transcript(_roles(sqlite_rt, run_id))


def test_the_wait_ends_failed_after_provider_wait_s(
    sqlite_rt: Runtime, stub: StubBroker, llm: FakeLLMServer
) -> None:
    model = RoundsModel(3)
    model.down = True
    llm.responder = model
    run_id = _submit(sqlite_rt, _agent(_profile(llm, provider_wait_s=60)))  # the profile's
    stub.drain(sqlite_rt)
    assert _run(sqlite_rt, run_id)["status"] == "waiting"
    with sqlite_rt.engine.begin() as conn:  # the outage began 61 s ago
        row = run_store.load_run(conn, run_id)
        assert row is not None and row.pending is not None
        pending = {**row.pending, "since": run_store.now() - 61}
        conn.execute(sa.update(runs).where(runs.c.id == run_id).values(pending=pending, wake_at=0))
    reap(sqlite_rt)
    stub.drain(sqlite_rt)
    failed = _run(sqlite_rt, run_id)
    assert failed["status"] == "failed" and failed["error"]["code"] == "model_error"
    assert "did not answer for" in failed["error"]["message"]


def test_provider_wait_is_bounded_by_the_operator(sqlite_rt: Runtime) -> None:
    settings = sqlite_rt.settings.model_copy(update={"provider_wait_max_s": 100.0})
    spec = AgentSpec.model_validate({"kind": "chat"})
    assert outage.provider_wait(settings, spec, ModelProfile(provider_wait_s=500)) == 100.0
    assert outage.provider_wait(settings, spec, ModelProfile()) == 100.0
    short = spec.model_copy(update={"provider_wait_s": 5.0})
    assert outage.provider_wait(settings, short, ModelProfile(provider_wait_s=500)) == 5.0


def _step(rt: Runtime, stub: StubBroker) -> None:
    """Deliver the next dispatch only."""
    item = stub.pop()
    assert item is not None
    stub.deliver(rt, item)


def _due_now(rt: Runtime, run_id: str) -> None:
    with rt.engine.begin() as conn:
        conn.execute(sa.update(runs).where(runs.c.id == run_id).values(wake_at=run_store.now() - 1))


def test_resume_on_another_profile(stub: StubBroker, sqlite_rt: Runtime) -> None:
    with FakeLLMServer() as primary, FakeLLMServer() as backup:
        primary.responder, backup.responder = RoundsModel(6), RoundsModel(6)
        primary.responder.down, primary.responder.down_from = True, 3
        rt = replace(
            sqlite_rt,
            profiles={
                "primary": ModelProfile.model_validate(_profile(primary, "primary")),
                "backup": ModelProfile.model_validate(_profile(backup, "backup")),
            },
        )
        run_id = _submit(rt, _agent("primary", provider_wait_s=0))
        stub.drain(rt)
        assert _run(rt, run_id)["status"] == "failed"
        agent = _run(rt, run_id)["agent"]
        new = lifecycle.NewSpec(
            lifecycle.merge_spec(agent, {"model": "backup"}), {"model": "backup"}, 0
        )
        lifecycle.resume_run(rt, ME, run_id, new)
        stub.drain(rt)
        done = _run(rt, run_id)
        assert done["status"] == "completed" and done["agent"]["model"] == "backup"
        assert done["spec_rev"] == 1
        assert requests_per_round(backup) == {k: 1 for k in range(3, 7)}
        with pytest.raises(Conflict):  # the overrides were made for revision 0
            lifecycle.resume_run(rt, ME, run_id, new)


def test_resume_refusals_write_nothing(
    sqlite_rt: Runtime, stub: StubBroker, llm: FakeLLMServer
) -> None:
    llm.responder = RoundsModel(2)
    run_id = _submit(sqlite_rt, _agent(_profile(llm)))
    with pytest.raises(Conflict):  # queued
        lifecycle.resume_run(sqlite_rt, ME, run_id)
    stub.drain(sqlite_rt)
    before = _run(sqlite_rt, run_id)
    with pytest.raises(Conflict):  # completed
        lifecycle.resume_run(sqlite_rt, ME, run_id)
    with pytest.raises(NotFound):  # another tenant's
        lifecycle.resume_run(sqlite_rt, lifecycle.Actor("acme"), run_id)
    after = _run(sqlite_rt, run_id)
    assert (after["version"], after["event_seq"]) == (before["version"], before["event_seq"])


def test_resume_of_a_cancelled_run_repairs_its_open_calls(
    sqlite_rt: Runtime, stub: StubBroker, llm: FakeLLMServer
) -> None:
    llm.responder = RoundsModel(3)
    run_id = _submit(sqlite_rt, _agent(_profile(llm)))
    _step(sqlite_rt, stub)  # round 1: its echo call is queued, not run
    commands.cancel_run(sqlite_rt, "default", run_id)
    stub.queue.clear()
    lifecycle.resume_run(sqlite_rt, ME, run_id)
    stub.drain(sqlite_rt)
    done = _run(sqlite_rt, run_id)
    assert done["status"] == "completed"
    with sqlite_rt.engine.connect() as conn:
        tools = [m["content"] for m in records.list_messages(conn, run_id) if m["role"] == "tool"]
    assert tools[0] == commands.CANCELLED_TEXT  # the model saw why round 1 had no result


# --- fork ----------------------------------------------------------------------------------------


def test_fork_shares_the_source_history_by_reference(
    sqlite_rt: Runtime, stub: StubBroker, llm: FakeLLMServer
) -> None:
    llm.responder = RoundsModel(6)
    source = _submit(sqlite_rt, _agent(_profile(llm)), "first question")
    stub.drain(sqlite_rt)
    src = _run(sqlite_rt, source)
    assert src["status"] == "completed" and src["round"] == 6
    source_rows = _rows(sqlite_rt, source)
    round4 = next(
        b for b in llm.bodies if sum(m["role"] == "assistant" for m in b["messages"]) == 3
    )
    seen = len(llm.bodies)

    forked = lifecycle.fork_run(
        sqlite_rt, ME, source, lifecycle.ForkInput(3, input="other question")
    )
    assert forked["status"] == "queued" and forked["round"] == 3
    assert (forked["base_run_id"], forked["fork_round"]) == (source, 3)
    stub.drain(sqlite_rt)
    fork = _run(sqlite_rt, forked["id"])
    assert fork["status"] == "completed"
    first = llm.bodies[seen]["messages"]
    assert first[: len(round4["messages"])] == round4["messages"]  # rounds 1-3, exactly
    assert first[len(round4["messages"]) :] == [{"role": "user", "content": "other question"}]
    assert _rows(sqlite_rt, source) == source_rows  # nothing of the source copied or added
    own = _rows(sqlite_rt, forked["id"])
    assert own == 1 + 2 * 2 + 1  # its input, rounds 4-5 (assistant + tool), its answer
    assert _rows(sqlite_rt) == source_rows + own
    with sqlite_rt.engine.connect() as conn:
        shown = records.list_messages(conn, forked["id"])
    assert [m["run_id"] for m in shown].count(source) == 1 + 3 * 2
    assert _run(sqlite_rt, source)["version"] == src["version"]  # the source untouched


def test_cancelling_a_fork_leaves_its_source_alone(
    sqlite_rt: Runtime, stub: StubBroker, llm: FakeLLMServer
) -> None:
    llm.responder = RoundsModel(4, ask_at=2)
    source = _submit(sqlite_rt, _agent(_profile(llm), ask=True))
    stub.drain(sqlite_rt)
    src = _run(sqlite_rt, source)
    assert src["status"] == "waiting" and src["pending"]["kind"] == "ask"
    forked = lifecycle.fork_run(
        sqlite_rt, ME, source, lifecycle.ForkInput(2, answers=["blue"], ask_id="ask2")
    )
    commands.cancel_run(sqlite_rt, "default", forked["id"])
    stub.drain(sqlite_rt)
    assert _run(sqlite_rt, source)["version"] == src["version"]
    other = lifecycle.fork_run(sqlite_rt, ME, source, lifecycle.ForkInput(2, answers=["red"]))
    seen = len(llm.bodies)
    stub.drain(sqlite_rt)
    assert _run(sqlite_rt, other["id"])["status"] == "completed"
    tool = llm.bodies[seen]["messages"][-1]
    assert tool["role"] == "tool" and tool["tool_call_id"] == "ask2" and "red" in tool["content"]
    commands.answer_run(sqlite_rt, "default", source, "ask2", ["blue"])  # the source goes on
    stub.drain(sqlite_rt)
    assert _run(sqlite_rt, source)["status"] == "completed"
    refork = lifecycle.fork_run(sqlite_rt, ME, source, lifecycle.ForkInput(2, answers=["red"]))
    stub.drain(sqlite_rt)  # answered differently after the source's own answer
    with sqlite_rt.engine.connect() as conn:
        tools = [m for m in records.list_messages(conn, refork["id"]) if m["role"] == "tool"]
    assert "red" in tools[1]["content"] and all("blue" not in t["content"] for t in tools)


def test_fork_refusals(sqlite_rt: Runtime, stub: StubBroker, llm: FakeLLMServer) -> None:
    llm.responder = RoundsModel(3)
    source = _submit(sqlite_rt, _agent(_profile(llm)))
    _step(sqlite_rt, stub)  # round 1 committed, its call still open
    rows = _rows(sqlite_rt)
    with pytest.raises(Conflict, match="not complete"):
        lifecycle.fork_run(sqlite_rt, ME, source, lifecycle.ForkInput(1))
    with pytest.raises(Conflict, match="rounds"):
        lifecycle.fork_run(sqlite_rt, ME, source, lifecycle.ForkInput(5))
    with pytest.raises(Conflict, match="question"):
        lifecycle.fork_run(sqlite_rt, ME, source, lifecycle.ForkInput(1, answers=["x"]))
    with pytest.raises(NotFound):
        lifecycle.fork_run(sqlite_rt, lifecycle.Actor("acme"), source, lifecycle.ForkInput(0))
    assert _rows(sqlite_rt) == rows
    with sqlite_rt.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(runs)).scalar_one() == 1


def test_a_fork_of_a_fork_before_its_branch_point(
    sqlite_rt: Runtime, stub: StubBroker, llm: FakeLLMServer
) -> None:
    llm.responder = RoundsModel(5)
    source = _submit(sqlite_rt, _agent(_profile(llm)))
    stub.drain(sqlite_rt)
    child = lifecycle.fork_run(sqlite_rt, ME, source, lifecycle.ForkInput(3, input="b"))
    stub.drain(sqlite_rt)
    grand = lifecycle.fork_run(sqlite_rt, ME, child["id"], lifecycle.ForkInput(1, input="c"))
    stub.drain(sqlite_rt)
    with sqlite_rt.engine.connect() as conn:
        view = records.list_messages(conn, grand["id"])
    assert [m["content"] for m in view if m["role"] == "user"] == ["go", "c"]
    assert [m["run_id"] for m in view][:3] == [source] * 3  # round 1 of the source
    assert [m["role"] for m in view][:4] == ["user", "assistant", "tool", "user"]


# --- steer ---------------------------------------------------------------------------------------


def test_a_message_to_a_waiting_run_follows_the_answer(
    sqlite_rt: Runtime, stub: StubBroker, llm: FakeLLMServer
) -> None:
    llm.responder = RoundsModel(3, ask_at=1)
    run_id = _submit(sqlite_rt, _agent(_profile(llm), ask=True))
    stub.drain(sqlite_rt)
    assert _run(sqlite_rt, run_id)["status"] == "waiting"
    seen = len(llm.bodies)
    lifecycle.steer_run(sqlite_rt, ME, run_id, "and make it quick")
    assert not stub.queue and _run(sqlite_rt, run_id)["steer"][0]["content"] == "and make it quick"
    commands.answer_run(sqlite_rt, "default", run_id, "ask1", ["red"])
    stub.drain(sqlite_rt)
    tail = llm.bodies[seen]["messages"][-3:]
    assert [m["role"] for m in tail] == ["assistant", "tool", "user"]
    assert tail[1]["tool_call_id"] == "ask1" and tail[2]["content"] == "and make it quick"
    assert _run(sqlite_rt, run_id)["steer"] is None


def test_a_message_during_a_tool_batch_lands_after_its_tool_messages(
    sqlite_rt: Runtime, stub: StubBroker, llm: FakeLLMServer
) -> None:
    llm.responder = RoundsModel(3)
    run_id = _submit(sqlite_rt, _agent(_profile(llm)))
    _step(sqlite_rt, stub)  # round 1 committed: its echo call is open
    assert _run(sqlite_rt, run_id)["open_calls"] == 1
    lifecycle.steer_run(sqlite_rt, ME, run_id, "also check the logs")
    stub.drain(sqlite_rt)
    second = llm.bodies[1]["messages"]
    assert [m["role"] for m in second[-3:]] == ["assistant", "tool", "user"]
    assert second[-1]["content"] == "also check the logs"
    assert _run(sqlite_rt, run_id)["status"] == "completed"


def test_a_message_to_a_run_whose_round_is_not_taken_yet_is_in_its_next_request(
    sqlite_rt: Runtime, stub: StubBroker, llm: FakeLLMServer
) -> None:
    llm.responder = RoundsModel(1)
    run_id = _submit(sqlite_rt, _agent(_profile(llm)))
    lifecycle.steer_run(sqlite_rt, ME, run_id, "in French please")
    stub.drain(sqlite_rt)  # the first dispatch is stale (the run moved): dropped
    assert len(llm.bodies) == 1
    assert [m["content"] for m in llm.bodies[0]["messages"] if m["role"] == "user"] == [
        "go",
        "in French please",
    ]


def test_steer_and_plan_refusals(sqlite_rt: Runtime, stub: StubBroker, llm: FakeLLMServer) -> None:
    llm.responder = RoundsModel(1)
    run_id = _submit(sqlite_rt, _agent(_profile(llm)))
    stub.drain(sqlite_rt)
    before = _run(sqlite_rt, run_id)
    with pytest.raises(Conflict):
        lifecycle.steer_run(sqlite_rt, ME, run_id, "too late")
    with pytest.raises(Conflict):
        lifecycle.edit_plan(sqlite_rt, ME, run_id, {"updates": [{"id": "s1", "status": "done"}]})
    with pytest.raises(NotFound):
        lifecycle.steer_run(sqlite_rt, lifecycle.Actor("acme"), run_id, "hi")
    assert _run(sqlite_rt, run_id)["event_seq"] == before["event_seq"]


# --- threads by reference ------------------------------------------------------------------------


def test_a_50_run_thread_stores_each_message_once(sqlite_rt: Runtime, stub: StubBroker) -> None:
    tid = commands.new_id("thr")
    threads.create_thread(sqlite_rt, "default", None, "enqueue", tid)
    spec = AgentSpec.model_validate(
        {"kind": "chat", "model": {"provider": "scripted", "replies": [{"text": "noted"}]}}
    )
    ids = []
    for i in range(50):
        ids.append(_submit(sqlite_rt, spec, f"turn {i}", thread=tid))
        stub.drain(sqlite_rt)
    own = sum(_run(sqlite_rt, r)["msg_seq"] - _run(sqlite_rt, r)["base_seq"] for r in ids)
    assert own == 100
    assert _rows(sqlite_rt) <= 1.1 * own
    with sqlite_rt.engine.connect() as conn:
        last = records.list_messages(conn, ids[-1])
    assert len(last) == 100
    assert [m["content"] for m in last if m["role"] == "user"] == [f"turn {i}" for i in range(50)]
    assert {m["kind"] for m in last[:-2]} == {"history"} and last[-1]["kind"] is None
    assert [m["seq"] for m in last] == sorted({m["seq"] for m in last})
