"""Threads on the stub broker (SPEC C-3): history across runs, one active run per
thread, and the three multitask policies (reject, enqueue, interrupt)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

import tests.plugins  # noqa: F401  (registers the test tools)
from shared.agent.spec import AgentSpec
from shared.engine import commands, threads
from shared.engine.reaper import reap
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.errors import Conflict, NotFound
from shared.llm.fake_server import FakeLLMServer, ReplySpec
from shared.store import records
from shared.store import runs as run_store
from shared.store.tables import runs


@pytest.fixture
def llm() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as server:  # echo responder: "echo: <last user text>"
        yield server


def _thread(rt: Runtime, multitask: str = "enqueue") -> str:
    tid = commands.new_id("thr")
    threads.create_thread(rt, "default", {"topic": "t"}, multitask, tid)
    return tid


def _chat(llm: FakeLLMServer, **profile: Any) -> AgentSpec:
    model = {
        "provider": "openai",
        "base_url": llm.base_url,
        "model": "m",
        "api_key_env": None,
        **profile,
    }
    return AgentSpec.model_validate({"kind": "chat", "system_prompt": "Be brief.", "model": model})


def _scripted(*texts: str, kind: str = "chat", **spec: Any) -> AgentSpec:
    replies = [{"text": t} for t in texts] or [{"text": "ok"}]
    return AgentSpec.model_validate(
        {"kind": kind, **spec, "model": {"provider": "scripted", "replies": replies}}
    )


def _submit(rt: Runtime, spec: AgentSpec, text: str, thread_id: str | None = None) -> str:
    row, _ = commands.submit_run(rt, commands.RunInput(agent=spec, input=text, thread_id=thread_id))
    return str(row["id"])


def _run(rt: Runtime, run_id: str) -> Any:
    with rt.engine.connect() as conn:
        return run_store.get_run(conn, run_id)


def _messages(rt: Runtime, run_id: str) -> list[tuple[str, str, str | None]]:
    with rt.engine.connect() as conn:
        rows = records.list_messages(conn, run_id)
    return [(m["role"], str(m["content"]), m["kind"]) for m in rows]


def _wire(body: dict[str, Any]) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in body["messages"]]


# --- history across runs ------------------------------------------------


def test_five_run_thread_each_run_sees_the_previous_turns(
    sqlite_rt: Runtime, stub: StubBroker, llm: FakeLLMServer
) -> None:
    tid = _thread(sqlite_rt)
    spec = _chat(llm)
    ids = []
    for i in range(1, 6):
        ids.append(_submit(sqlite_rt, spec, f"question {i}", tid))
        stub.drain(sqlite_rt)
    assert [_run(sqlite_rt, i)["result"]["text"] for i in ids] == [
        f"echo: question {i}" for i in range(1, 6)
    ]
    bodies = llm.bodies
    assert len(bodies) == 5
    for n, body in enumerate(bodies, start=1):
        turns = [
            pair
            for i in range(1, n)
            for pair in (("user", f"question {i}"), ("assistant", f"echo: question {i}"))
        ]
        assert _wire(body) == [("system", "Be brief."), *turns, ("user", f"question {n}")]
    # the copies are stored with the run, marked as history; the run's own messages follow
    stored = _messages(sqlite_rt, ids[2])
    assert [k for _, _, k in stored] == ["history"] * 4 + [None, None]


def test_small_context_window_drops_the_oldest_turns_first(
    sqlite_rt: Runtime, stub: StubBroker, llm: FakeLLMServer
) -> None:
    # SPEC C-3: groups kept newest first while they fit; the newest (the question) always
    tid = _thread(sqlite_rt)
    spec = _chat(llm, context_window=260, max_tokens=60)
    pad = "x" * 120
    for i in range(1, 6):
        _submit(sqlite_rt, spec, f"question {i} {pad}", tid)
        stub.drain(sqlite_rt)
    last = [text for role, text in _wire(llm.bodies[-1]) if role == "user"]
    assert last[-1].startswith("question 5")
    assert not any(t.startswith("question 1") for t in last)  # the oldest went first
    assert any(t.startswith("question 4") for t in last)  # the newest earlier turn stayed
    numbers = [int(t.split()[1]) for t in last]
    assert numbers == list(range(numbers[0], 6))  # a contiguous suffix: no gap in the middle


def test_a_run_without_a_thread_takes_no_history(
    sqlite_rt: Runtime, stub: StubBroker, llm: FakeLLMServer
) -> None:
    _submit(sqlite_rt, _chat(llm), "one", _thread(sqlite_rt))
    _submit(sqlite_rt, _chat(llm), "two")
    stub.drain(sqlite_rt)
    assert _wire(llm.bodies[-1]) == [("system", "Be brief."), ("user", "two")]


def test_unknown_thread_is_not_found(sqlite_rt: Runtime) -> None:
    with pytest.raises(NotFound):
        _submit(sqlite_rt, _scripted("hi"), "hello", "thr_nope")
    with sqlite_rt.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(runs)).scalar() == 0


# --- multitask: enqueue (the default) --------------------------------------------------


def test_enqueue_holds_the_new_run_until_the_active_one_ends(
    sqlite_rt: Runtime, stub: StubBroker
) -> None:
    tid = _thread(sqlite_rt)
    first = _submit(sqlite_rt, _scripted("Paris."), "capital of France?", tid)
    second = _submit(sqlite_rt, _scripted("Rome."), "and of Italy?", tid)
    held = _run(sqlite_rt, second)
    assert (held["status"], held["held"]) == ("queued", True)
    assert [d.run_id for d in stub.sent] == [first]  # the held run is not published
    assert _messages(sqlite_rt, second) == []  # its input waits with it
    stub.drain(sqlite_rt)
    done = _run(sqlite_rt, second)
    assert (done["status"], done["held"], done["result"]["text"]) == ("completed", False, "Rome.")
    # released when the first ended: it saw the finished run's messages as history
    assert _messages(sqlite_rt, second) == [
        ("user", "capital of France?", "history"),
        ("assistant", "Paris.", "history"),
        ("user", "and of Italy?", None),
        ("assistant", "Rome.", None),
    ]
    with sqlite_rt.engine.connect() as conn:
        types = [e["type"] for e in records.list_events(conn, second)]
    assert types[:2] == ["run.queued", "run.released"]


def test_enqueued_runs_start_one_at_a_time_in_order(sqlite_rt: Runtime, stub: StubBroker) -> None:
    tid = _thread(sqlite_rt)
    ids = [_submit(sqlite_rt, _scripted(f"a{i}"), f"q{i}", tid) for i in range(3)]
    order: list[str] = []
    while (item := stub.pop()) is not None:
        active = [
            i
            for i in ids
            if _run(sqlite_rt, i)["status"] in ("running", "waiting")
            or (_run(sqlite_rt, i)["status"] == "queued" and not _run(sqlite_rt, i)["held"])
        ]
        assert len(active) <= 1  # one active run per thread
        order.append(item.run_id)
        stub.deliver(sqlite_rt, item)
    assert order == ids
    assert [m[1] for m in _messages(sqlite_rt, ids[2])] == ["q0", "a0", "q1", "a1", "q2", "a2"]


def test_a_waiting_run_keeps_the_thread_busy(sqlite_rt: Runtime, stub: StubBroker) -> None:
    ask = {
        "tool_calls": [
            {
                "id": "ask1",
                "name": "ask_user",
                "arguments": {
                    "reason": "r",
                    "questions": [
                        {
                            "question": "Which city?",
                            "options": [
                                {"label": "Oslo", "value": "oslo"},
                                {"label": "Rome", "value": "rome"},
                            ],
                        }
                    ],
                },
            }
        ]
    }
    spec = AgentSpec.model_validate(
        {
            "kind": "agent",
            "ask": True,
            "model": {"provider": "scripted", "replies": [ask, {"text": "Oslo it is."}]},
        }
    )
    tid = _thread(sqlite_rt)
    first = _submit(sqlite_rt, spec, "plan a trip", tid)
    stub.drain(sqlite_rt)
    assert _run(sqlite_rt, first)["status"] == "waiting"
    second = _submit(sqlite_rt, _scripted("noted"), "also book a hotel", tid)
    stub.drain(sqlite_rt)
    assert _run(sqlite_rt, second)["held"]
    commands.answer_run(sqlite_rt, "default", first, "ask1", ["oslo"])
    stub.drain(sqlite_rt)
    assert _run(sqlite_rt, first)["status"] == "completed"
    assert _run(sqlite_rt, second)["status"] == "completed"
    roles = [(r, k) for r, _, k in _messages(sqlite_rt, second)]
    assert roles[:4] == [
        ("user", "history"),
        ("assistant", "history"),
        ("tool", "history"),
        ("assistant", "history"),
    ]


def test_a_failed_run_releases_the_next(
    sqlite_rt: Runtime, stub: StubBroker, llm: FakeLLMServer
) -> None:
    llm.enqueue(ReplySpec(status=401, body={"error": {"message": "bad key"}}))
    tid = _thread(sqlite_rt)
    first = _submit(sqlite_rt, _chat(llm), "one", tid)
    second = _submit(sqlite_rt, _chat(llm), "two", tid)
    stub.drain(sqlite_rt)
    assert _run(sqlite_rt, first)["status"] == "failed"
    assert _run(sqlite_rt, second)["result"]["text"] == "echo: two"
    # the failed run's question is history (what happened), its missing answer is not invented
    assert _wire(llm.bodies[-1])[1:] == [("user", "one"), ("user", "two")]


def test_a_join_that_ends_the_run_releases_the_next(sqlite_rt: Runtime, stub: StubBroker) -> None:
    # an external tool and a stop tool in one reply: the tool's join ends the run (toolrun path)
    reply = {
        "tool_calls": [
            {"id": "e1", "name": "echo", "arguments": {"text": "hi"}},
            {"id": "s1", "name": "stop", "arguments": {"reason": "done"}},
        ]
    }
    spec = AgentSpec.model_validate(
        {
            "kind": "agent",
            "tools": ["echo", "stop"],
            "model": {"provider": "scripted", "replies": [reply]},
        }
    )
    tid = _thread(sqlite_rt)
    first = _submit(sqlite_rt, spec, "go", tid)
    second = _submit(sqlite_rt, _scripted("next"), "then", tid)
    stub.drain(sqlite_rt)
    assert _run(sqlite_rt, first)["stop_reason"] == "stop_tool"
    assert _run(sqlite_rt, second)["status"] == "completed"


def test_cancelling_a_held_run_it_never_starts(sqlite_rt: Runtime, stub: StubBroker) -> None:
    tid = _thread(sqlite_rt)
    first = _submit(sqlite_rt, _scripted("a1"), "q1", tid)
    second = _submit(sqlite_rt, _scripted("a2"), "q2", tid)
    third = _submit(sqlite_rt, _scripted("a3"), "q3", tid)
    commands.cancel_run(sqlite_rt, "default", second)
    stub.drain(sqlite_rt)
    assert [_run(sqlite_rt, i)["status"] for i in (first, second, third)] == [
        "completed",
        "cancelled",
        "completed",
    ]
    assert [m[1] for m in _messages(sqlite_rt, third)] == ["q1", "a1", "q3", "a3"]


def test_cancelling_the_active_run_releases_the_next(sqlite_rt: Runtime, stub: StubBroker) -> None:
    tid = _thread(sqlite_rt)
    first = _submit(sqlite_rt, _scripted("a1"), "q1", tid)
    second = _submit(sqlite_rt, _scripted("a2"), "q2", tid)
    commands.cancel_run(sqlite_rt, "default", first)
    assert _run(sqlite_rt, second)["held"] is False
    stub.drain(sqlite_rt)
    assert _run(sqlite_rt, second)["status"] == "completed"


# --- multitask: reject -----------------------------------------------------------------


def test_reject_refuses_a_run_on_a_busy_thread(sqlite_rt: Runtime, stub: StubBroker) -> None:
    tid = _thread(sqlite_rt, "reject")
    _submit(sqlite_rt, _scripted("a1"), "q1", tid)
    with pytest.raises(Conflict, match="busy"):
        _submit(sqlite_rt, _scripted("a2"), "q2", tid)
    stub.drain(sqlite_rt)
    later = _submit(sqlite_rt, _scripted("a3"), "q3", tid)  # free again
    stub.drain(sqlite_rt)
    assert [m[1] for m in _messages(sqlite_rt, later)] == ["q1", "a1", "q3", "a3"]
    with sqlite_rt.engine.connect() as conn:
        assert len(run_store.list_runs(conn, "default", thread_id=tid)) == 2


# --- multitask: interrupt --------------------------------------------------------------


def test_interrupt_cancels_the_active_run_and_repairs_its_tool_calls(
    sqlite_rt: Runtime, stub: StubBroker
) -> None:
    spec = AgentSpec.model_validate(
        {
            "kind": "agent",
            "tools": ["echo"],
            "model": {
                "provider": "scripted",
                "replies": [
                    {"tool_calls": [{"id": "e1", "name": "echo", "arguments": {"text": "slow"}}]},
                    {"text": "never"},
                ],
            },
        }
    )
    tid = _thread(sqlite_rt, "interrupt")
    first = _submit(sqlite_rt, spec, "long task", tid)
    round_msg = stub.pop()
    assert round_msg is not None
    stub.deliver(sqlite_rt, round_msg)  # the model called echo; the tool call is queued
    second = _submit(sqlite_rt, _scripted("fresh start"), "new question", tid)
    old = _run(sqlite_rt, first)
    assert (old["status"], old["stop_reason"]) == ("cancelled", "cancelled")
    assert _messages(sqlite_rt, first)[-1] == ("tool", commands.CANCELLED_TEXT, None)
    stub.drain(sqlite_rt)  # the stale tool message does nothing
    assert _run(sqlite_rt, first)["status"] == "cancelled"
    assert _run(sqlite_rt, second)["result"]["text"] == "fresh start"
    assert [(r, k) for r, _, k in _messages(sqlite_rt, second)] == [
        ("user", "history"),
        ("assistant", "history"),
        ("tool", "history"),
        ("user", None),
        ("assistant", None),
    ]
    with sqlite_rt.engine.connect() as conn:
        cancelled = [e for e in records.list_events(conn, first) if e["type"] == "run.cancelled"]
    assert cancelled[0]["data"] == {"interrupted_by": second}


def test_interrupt_on_an_idle_thread_just_starts(sqlite_rt: Runtime, stub: StubBroker) -> None:
    tid = _thread(sqlite_rt, "interrupt")
    first = _submit(sqlite_rt, _scripted("a1"), "q1", tid)
    stub.drain(sqlite_rt)
    second = _submit(sqlite_rt, _scripted("a2"), "q2", tid)
    stub.drain(sqlite_rt)
    assert [_run(sqlite_rt, i)["status"] for i in (first, second)] == ["completed", "completed"]


# --- durability ------------------------------------------------------------------------


def test_the_reaper_never_starts_a_held_run(sqlite_rt: Runtime, stub: StubBroker) -> None:
    tid = _thread(sqlite_rt)
    _submit(sqlite_rt, _scripted("a1"), "q1", tid)
    second = _submit(sqlite_rt, _scripted("a2"), "q2", tid)
    stub.queue.clear()
    with sqlite_rt.engine.begin() as conn:  # long idle: the orphan pass looks at queued runs
        conn.execute(sa.update(runs).values(updated_at=run_store.now() - 3600))
    reap(sqlite_rt)
    assert second not in {d.run_id for d in stub.queue}
    assert _run(sqlite_rt, second)["held"]


def test_the_reaper_releases_a_run_a_missed_ending_left_held(
    sqlite_rt: Runtime, stub: StubBroker
) -> None:
    tid = _thread(sqlite_rt)
    first = _submit(sqlite_rt, _scripted("a1"), "q1", tid)
    second = _submit(sqlite_rt, _scripted("a2"), "q2", tid)
    with sqlite_rt.engine.begin() as conn:  # an ending that bypassed the transition
        conn.execute(sa.update(runs).where(runs.c.id == first).values(status="failed"))
    stub.queue.clear()
    assert reap(sqlite_rt).released == 1
    stub.drain(sqlite_rt)
    assert _run(sqlite_rt, second)["status"] == "completed"


def test_the_demo_agent_on_a_thread_calls_its_tools_again(
    sqlite_rt: Runtime, stub: StubBroker
) -> None:
    # the earlier run's tool results are history, not this run's results
    spec = AgentSpec.model_validate({"kind": "agent", "model": "demo", "tools": ["calculator"]})
    tid = _thread(sqlite_rt)
    _submit(sqlite_rt, spec, "What is 2+3?", tid)
    stub.drain(sqlite_rt)
    second = _submit(sqlite_rt, spec, "And 4*5?", tid)
    stub.drain(sqlite_rt)
    assert "calculator: 20" in _run(sqlite_rt, second)["result"]["text"]
