"""Sub-agents as child runs: a tool agent as a tool starts a child run; the child's
end joins the parent in one transaction; its pauses surface on the parent; cancel cascades."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from shared.engine import children, commands
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.errors import Conflict
from shared.llm.fake_server import FakeLLMServer, ReplySpec
from shared.store import calls as call_store
from shared.store import records
from shared.store.tables import runs, usage
from tests.engine.helpers import agent, call, due_work, run, submit, transcript

PRICING = {"tiers": [{"input": 1.0, "output": 1.0}]}
ASK = {"question": "Which city?", "options": ["Paris", "Rome"]}


def _scripted(*replies: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {"provider": "scripted", "replies": list(replies), "pricing": PRICING, **kw}


def _child(*replies: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"kind": "agent", "model": _scripted(*replies), **spec}


def _tool(name: str, child: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {
        "name": name,
        "description": f"Delegate to {name}.",
        "agent": child,
        "read_only": True,
        **kw,
    }


def _parent(replies: list[dict[str, Any]], *tools: dict[str, Any], **spec: Any) -> Any:
    return agent(replies, tools=list(tools), model_extra={"pricing": PRICING}, **spec)


def _children_of(rt: Runtime, run_id: str) -> list[Any]:
    with rt.engine.connect() as conn:
        return list(
            conn.execute(
                sa.select(runs)
                .where(runs.c.parent_run_id == run_id)
                .order_by(runs.c.parent_call_id)
            ).mappings()
        )


def _tool_texts(rt: Runtime, run_id: str) -> list[str]:
    return [text for role, text, _ in transcript(rt, run_id) if role == "tool"]


def _two_researchers() -> Any:
    alpha = _child({"text": "Alpha found 42."})
    beta = _child(
        {"tool_calls": [call("echo", {"text": "b"}, "e1")]},
        {"text": "Beta found 7."},
        tools=["echo"],
    )
    return _parent(
        [
            {
                "tool_calls": [
                    call("alpha", {"input": "look A"}, "c1"),
                    call("beta", {"input": "look B"}, "c2"),
                ]
            },
            {"text": "Both done."},
        ],
        _tool("alpha", alpha),
        _tool("beta", beta),
        parallel_tools=2,
    )


def test_two_sub_agents_run_as_children_and_join_in_call_order(
    sqlite_rt: Runtime, stub: StubBroker
) -> None:
    run_id = submit(sqlite_rt, _two_researchers(), "research")
    stub.drain(sqlite_rt)
    parent = run(sqlite_rt, run_id)
    assert parent["status"] == "completed" and parent["result"]["text"] == "Both done."
    kids = _children_of(sqlite_rt, run_id)
    assert [k["parent_call_id"] for k in kids] == ["c1", "c2"]
    assert [k["id"] for k in kids] == [children.child_run_id(run_id, c) for c in ("c1", "c2")]
    assert all(k["status"] == "completed" and k["tenant"] == parent["tenant"] for k in kids)
    assert _tool_texts(sqlite_rt, run_id) == ["Alpha found 42.", "Beta found 7."]
    assert transcript(sqlite_rt, kids[0]["id"])[0][:2] == ("user", "look A")
    # the cost rolls up: the parent's own model calls plus each child's whole cost
    with sqlite_rt.engine.connect() as conn:
        calls = call_store.list_tool_calls(conn, run_id)
    assert [c["cost"] for c in calls] == [k["cost"] for k in kids]
    own = parent["cost"] - sum(k["cost"] for k in kids)
    assert all(k["cost"] > 0 for k in kids) and own > 0
    assert [c["status"] for c in calls] == ["done", "done"]


def test_the_parent_holds_no_message_while_its_children_work(
    sqlite_rt: Runtime, stub: StubBroker
) -> None:
    run_id = submit(sqlite_rt, _two_researchers(), "research")
    for _ in range(3):  # the round, then the two tool messages that start the children
        item = stub.pop()
        assert item is not None
        stub.deliver(sqlite_rt, item)
    parent = run(sqlite_rt, run_id)
    assert (parent["status"], parent["open_calls"]) == ("running", 2)
    with sqlite_rt.engine.connect() as conn:
        assert [c["status"] for c in call_store.list_tool_calls(conn, run_id)] == ["child", "child"]
    assert due_work(sqlite_rt, run_id) == 0  # only the children have work queued
    assert due_work(sqlite_rt, *[k["id"] for k in _children_of(sqlite_rt, run_id)]) == 2


class TwiceBroker(StubBroker):
    """A broker that delivers every message twice (at-least-once, the worst case)."""

    def deliver(self, rt: Runtime, item: Any) -> str:
        first = super().deliver(rt, item)
        super().deliver(rt, item)
        return first


def test_duplicate_deliveries_start_each_child_once_and_join_once(tmp_path: Any) -> None:
    from shared.config import Settings
    from shared.store.db import make_engine, migrate

    url = f"sqlite:///{tmp_path / 'twice.db'}"
    engine = make_engine(url)
    migrate(engine)
    broker = TwiceBroker()
    rt = Runtime(
        engine=engine, settings=Settings(database_url=url, broker_url="memory://"), publish=broker
    )
    try:
        run_id = submit(rt, _two_researchers(), "research")
        broker.drain(rt)
        assert run(rt, run_id)["status"] == "completed"
        assert len(_children_of(rt, run_id)) == 2
        assert _tool_texts(rt, run_id) == ["Alpha found 42.", "Beta found 7."]
        roles = [r for r, _, _ in transcript(rt, run_id)]
        assert roles == ["user", "assistant", "tool", "tool", "assistant"]
    finally:
        engine.dispose()


def test_a_child_start_is_exactly_once_even_when_retried(
    sqlite_rt: Runtime, stub: StubBroker
) -> None:
    run_id = submit(sqlite_rt, _two_researchers(), "research")
    stub.deliver(sqlite_rt, stub.pop())  # type: ignore[arg-type]
    item = stub.pop()
    assert item is not None
    assert stub.deliver(sqlite_rt, item) == "committed"
    assert stub.deliver(sqlite_rt, item) == "stale"  # the same message again: nothing
    assert len(_children_of(sqlite_rt, run_id)) == 1


def _asking_parent(**child_spec: Any) -> Any:
    child = _child(
        {"tool_calls": [call("ask_user", ASK, "ask7")]},
        {"text": "Booked Paris."},
        ask=True,
        **child_spec,
    )
    return _parent(
        [
            {"tool_calls": [call("booker", {"input": "book a trip"}, "c1")]},
            {"text": "Trip booked."},
        ],
        _tool("booker", child),
    )


def test_a_child_question_is_the_parents_pending_ask(sqlite_rt: Runtime, stub: StubBroker) -> None:
    run_id = submit(sqlite_rt, _asking_parent(), "trip")
    stub.drain(sqlite_rt)
    (kid,) = _children_of(sqlite_rt, run_id)
    parent = run(sqlite_rt, run_id)
    assert kid["status"] == "waiting" and parent["status"] == "waiting"
    pending = parent["pending"]
    assert (pending["kind"], pending["ask_id"], pending["run_id"]) == ("ask", "ask7", kid["id"])
    assert pending["questions"] == kid["pending"]["questions"]
    assert parent["wake_at"] is None  # the child's ask expires, not the parent's
    assert due_work(sqlite_rt, run_id, kid["id"]) == 0 and not stub.queue  # D-3: nothing queued

    shown = commands.answer_run(sqlite_rt, "default", run_id, "ask7", ["Paris"])
    assert shown["id"] == run_id and shown["status"] == "running"  # waiting on its child again
    assert run(sqlite_rt, kid["id"])["status"] == "running"
    again = commands.answer_run(sqlite_rt, "default", run_id, "ask7", ["Paris"])
    assert again["id"] == run_id  # the same answer twice: idempotent
    with pytest.raises(Conflict):
        commands.answer_run(sqlite_rt, "default", run_id, "ask7", ["Rome"])
    stub.drain(sqlite_rt)
    assert run(sqlite_rt, kid["id"])["result"]["text"] == "Booked Paris."
    parent = run(sqlite_rt, run_id)
    assert parent["status"] == "completed" and parent["result"]["text"] == "Trip booked."
    assert _tool_texts(sqlite_rt, run_id) == ["Booked Paris."]
    assert _tool_texts(sqlite_rt, kid["id"]) == ["## Which city?\nAnswer: Paris"]
    with sqlite_rt.engine.connect() as conn:
        types = [e["type"] for e in records.list_events(conn, run_id)]
    assert types.count("run.waiting") == 1 and "run.resumed" in types


def test_answering_the_child_itself_resumes_the_parent_too(
    sqlite_rt: Runtime, stub: StubBroker
) -> None:
    run_id = submit(sqlite_rt, _asking_parent(), "trip")
    stub.drain(sqlite_rt)
    (kid,) = _children_of(sqlite_rt, run_id)
    commands.answer_run(sqlite_rt, "default", kid["id"], "ask7", ["Rome"])
    assert run(sqlite_rt, run_id)["status"] == "running"
    stub.drain(sqlite_rt)
    assert run(sqlite_rt, run_id)["status"] == "completed"


def test_a_grandchild_question_surfaces_at_the_root(sqlite_rt: Runtime, stub: StubBroker) -> None:
    grandchild = _child(
        {"tool_calls": [call("ask_user", ASK, "deep")]}, {"text": "G: Paris."}, ask=True
    )
    middle = _child(
        {"tool_calls": [call("deeper", {"input": "ask them"}, "m1")]},
        {"text": "M: done."},
        tools=[_tool("deeper", grandchild)],
    )
    root_id = submit(
        sqlite_rt,
        _parent(
            [{"tool_calls": [call("mid", {"input": "go"}, "r1")]}, {"text": "R: done."}],
            _tool("mid", middle),
        ),
    )
    stub.drain(sqlite_rt)
    (mid,) = _children_of(sqlite_rt, root_id)
    (deep,) = _children_of(sqlite_rt, mid["id"])
    root = run(sqlite_rt, root_id)
    assert [r["status"] for r in (root, mid, deep)] == ["waiting"] * 3
    assert root["pending"]["run_id"] == deep["id"] and root["pending"]["ask_id"] == "deep"
    commands.answer_run(sqlite_rt, "default", root_id, "deep", ["Paris"])
    assert run(sqlite_rt, root_id)["status"] == run(sqlite_rt, mid["id"])["status"] == "running"
    stub.drain(sqlite_rt)
    assert run(sqlite_rt, root_id)["result"]["text"] == "R: done."
    assert _tool_texts(sqlite_rt, root_id) == ["M: done."]
    assert _tool_texts(sqlite_rt, mid["id"]) == ["G: Paris."]


def test_two_asking_children_are_shown_one_after_the_other(
    sqlite_rt: Runtime, stub: StubBroker
) -> None:
    def asker(ask_id: str, answer: str) -> dict[str, Any]:
        return _child({"tool_calls": [call("ask_user", ASK, ask_id)]}, {"text": answer}, ask=True)

    run_id = submit(
        sqlite_rt,
        _parent(
            [
                {"tool_calls": [call("a", {"input": "x"}, "c1"), call("b", {"input": "y"}, "c2")]},
                {"text": "done"},
            ],
            _tool("a", asker("qa", "A ok")),
            _tool("b", asker("qb", "B ok")),
            parallel_tools=2,
        ),
    )
    stub.drain(sqlite_rt)
    assert run(sqlite_rt, run_id)["pending"]["ask_id"] == "qa"
    commands.answer_run(sqlite_rt, "default", run_id, "qa", ["Paris"])
    assert run(sqlite_rt, run_id)["pending"]["ask_id"] == "qb"  # the other one is next
    stub.drain(sqlite_rt)
    assert run(sqlite_rt, run_id)["status"] == "waiting"
    commands.answer_run(sqlite_rt, "default", run_id, "qb", ["Rome"])
    stub.drain(sqlite_rt)
    assert run(sqlite_rt, run_id)["status"] == "completed"
    assert _tool_texts(sqlite_rt, run_id) == ["A ok", "B ok"]


def test_a_guarded_childs_approval_is_decided_through_the_parent(
    sqlite_rt: Runtime, stub: StubBroker
) -> None:
    child = _child(
        {"tool_calls": [call("write_thing", {"item": "A"}, "w1")]},
        {"text": "Wrote A."},
        tools=["write_thing"],
        guarded=True,
    )
    run_id = submit(
        sqlite_rt,
        _parent(
            [{"tool_calls": [call("writer", {"input": "A"}, "c1")]}, {"text": "All written."}],
            _tool("writer", child),
        ),
    )
    stub.drain(sqlite_rt)
    parent = run(sqlite_rt, run_id)
    (kid,) = _children_of(sqlite_rt, run_id)
    assert parent["status"] == "waiting" and parent["pending"]["kind"] == "approval"
    assert parent["pending"]["run_id"] == kid["id"]
    assert parent["pending"]["approval_id"] == kid["pending"]["approval_id"]
    assert due_work(sqlite_rt, run_id, kid["id"]) == 0
    shown = commands.approve_run(
        sqlite_rt, "default", run_id, parent["pending"]["approval_id"], "all"
    )
    assert shown["status"] == "running"
    stub.drain(sqlite_rt)
    assert run(sqlite_rt, run_id)["result"]["text"] == "All written."
    assert _tool_texts(sqlite_rt, kid["id"]) == ["wrote A"]
    assert _tool_texts(sqlite_rt, run_id) == ["Wrote A."]


def test_cancelling_the_parent_cancels_its_children(sqlite_rt: Runtime, stub: StubBroker) -> None:
    run_id = submit(sqlite_rt, _asking_parent(), "trip")
    stub.drain(sqlite_rt)
    (kid,) = _children_of(sqlite_rt, run_id)
    commands.cancel_run(sqlite_rt, "default", run_id)
    assert run(sqlite_rt, run_id)["status"] == "cancelled"
    assert run(sqlite_rt, kid["id"])["status"] == "cancelled"
    assert _tool_texts(sqlite_rt, run_id) == [commands.CANCELLED_TEXT]
    # what the child spent is in the parent's totals, though no join brought it
    with sqlite_rt.engine.connect() as conn:
        spent = sa.select(sa.func.sum(usage.c.cost)).where(
            usage.c.run_id.in_([run_id, kid["id"]]), usage.c.committed
        )
        total = conn.execute(spent).scalar_one()
    assert run(sqlite_rt, kid["id"])["cost"] > 0
    assert run(sqlite_rt, run_id)["cost"] == pytest.approx(total)
    assert due_work(sqlite_rt, run_id, kid["id"]) == 0
    stub.drain(sqlite_rt)
    assert run(sqlite_rt, run_id)["status"] == "cancelled"


def test_cancelling_a_working_child_tree_mid_batch(sqlite_rt: Runtime, stub: StubBroker) -> None:
    run_id = submit(sqlite_rt, _two_researchers(), "research")
    for _ in range(3):
        stub.deliver(sqlite_rt, stub.pop())  # type: ignore[arg-type]
    commands.cancel_run(sqlite_rt, "default", run_id)
    stub.drain(sqlite_rt)  # the children's round messages are stale now
    assert [k["status"] for k in _children_of(sqlite_rt, run_id)] == ["cancelled"] * 2
    assert run(sqlite_rt, run_id)["status"] == "cancelled"


def test_cancelling_a_child_is_its_calls_result(sqlite_rt: Runtime, stub: StubBroker) -> None:
    run_id = submit(sqlite_rt, _asking_parent(), "trip")
    stub.drain(sqlite_rt)
    (kid,) = _children_of(sqlite_rt, run_id)
    commands.cancel_run(sqlite_rt, "default", kid["id"])
    assert run(sqlite_rt, run_id)["status"] == "running"  # no longer waiting on the child
    stub.drain(sqlite_rt)
    assert run(sqlite_rt, run_id)["status"] == "completed"
    assert _tool_texts(sqlite_rt, run_id) == ["Tool error: the sub-agent run was cancelled"]


@pytest.fixture
def llm() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as server:
        yield server


def test_a_failed_child_is_a_tool_error(
    sqlite_rt: Runtime, stub: StubBroker, llm: FakeLLMServer
) -> None:
    llm.enqueue(ReplySpec(status=400, body={"error": {"message": "bad request"}}))
    child = {
        "kind": "agent",
        "model": {
            "provider": "openai",
            "base_url": llm.base_url,
            "model": "m",
            "tool_mode": "native",
        },
    }
    run_id = submit(
        sqlite_rt,
        _parent(
            [{"tool_calls": [call("sub", {"input": "x"}, "c1")]}, {"text": "Recovered."}],
            _tool("sub", child),
        ),
    )
    stub.drain(sqlite_rt)
    (kid,) = _children_of(sqlite_rt, run_id)
    assert kid["status"] == "failed"
    assert run(sqlite_rt, run_id)["result"]["text"] == "Recovered."
    (text,) = _tool_texts(sqlite_rt, run_id)
    assert text.startswith("Tool error: the sub-agent failed:") and "bad request" in text


def test_a_stop_after_a_sub_agent_ends_the_parent_when_the_child_ends(
    sqlite_rt: Runtime, stub: StubBroker
) -> None:
    child = _child({"text": "sub done"})
    spec = _parent(
        [
            {
                "tool_calls": [
                    call("sub", {"input": "x"}, "c1"),
                    call("stop", {"reason": "enough"}, "s1"),
                ]
            }
        ],
        _tool("sub", child),
        "stop",
    )
    run_id = submit(sqlite_rt, spec)
    stub.drain(sqlite_rt)
    parent = run(sqlite_rt, run_id)
    assert (parent["status"], parent["stop_reason"]) == ("completed", "stop_tool")
    assert _tool_texts(sqlite_rt, run_id)[0] == "sub done"


def test_the_child_inherits_the_parents_deadline(sqlite_rt: Runtime, stub: StubBroker) -> None:
    child = _child({"text": "ok"})
    spec = _parent(
        [{"tool_calls": [call("sub", {"input": "x"}, "c1")]}, {"text": "fine"}],
        _tool("sub", child),
        budget={"deadline_s": 600},
    )
    run_id = submit(sqlite_rt, spec)
    stub.drain(sqlite_rt)
    (kid,) = _children_of(sqlite_rt, run_id)
    assert kid["deadline_at"] == run(sqlite_rt, run_id)["deadline_at"]


def test_a_crash_in_the_childs_final_commit_rolls_back_the_child_too(
    sqlite_rt: Runtime, stub: StubBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the child's end and the parent's join are one transaction: fail the join, and the
    # child is not completed either; the message's redelivery then does both
    run_id = submit(
        sqlite_rt,
        _parent(
            [{"tool_calls": [call("sub", {"input": "x"}, "c1")]}, {"text": "after"}],
            _tool("sub", _child({"text": "A"})),
        ),
    )
    for _ in range(2):
        stub.deliver(sqlite_rt, stub.pop())  # type: ignore[arg-type]
    child_round = stub.pop()
    assert child_round is not None
    real = children._finish_child

    def crash(*args: Any, **kw: Any) -> Any:
        raise RuntimeError("worker died mid-commit")

    monkeypatch.setattr(children, "_finish_child", crash)
    assert stub.deliver(sqlite_rt, child_round) == "retry"  # L-12: tried again after a pause
    (kid,) = _children_of(sqlite_rt, run_id)
    assert kid["status"] == "running" and run(sqlite_rt, run_id)["open_calls"] == 1
    assert kid["attempts"] == 1 and kid["last_error"]["message"] == "worker died mid-commit"
    monkeypatch.setattr(children, "_finish_child", real)
    retry = stub.pop()
    assert retry is not None and retry.countdown and retry.run_id == kid["id"]
    assert stub.deliver(sqlite_rt, retry) == "committed"
    assert run(sqlite_rt, kid["id"])["attempts"] == 0  # the round committed
    stub.drain(sqlite_rt)
    assert run(sqlite_rt, run_id)["result"]["text"] == "after"
    assert _tool_texts(sqlite_rt, run_id) == ["A"]


def test_a_childs_expired_ask_resumes_the_chain(sqlite_rt: Runtime, stub: StubBroker) -> None:
    import time

    from shared.engine.reaper import reap

    run_id = submit(sqlite_rt, _asking_parent(ask_timeout_s=0.2), "trip")
    stub.drain(sqlite_rt)
    assert run(sqlite_rt, run_id)["status"] == "waiting"
    time.sleep(0.3)
    assert reap(sqlite_rt).expired_asks == 1  # the child's ask, not the parent's view of it
    assert run(sqlite_rt, run_id)["status"] == "running"
    stub.drain(sqlite_rt)
    assert run(sqlite_rt, run_id)["status"] == "completed"


# --- PostgreSQL: concurrent child ends, cancels and the lock order ----------------------------


@pytest.fixture
def pg_rt(pg_engine: sa.engine.Engine, pg_url: str, stub: StubBroker) -> Runtime:
    from shared.config import Settings

    return Runtime(
        engine=pg_engine,
        settings=Settings(database_url=pg_url, broker_url="memory://"),
        publish=stub,
    )


def _deliver_all(rt: Runtime, stub: StubBroker, extra: Any = None) -> list[BaseException]:
    """Deliver every queued message at once, each in its own thread (and ``extra``)."""
    import threading

    errors: list[BaseException] = []
    items = []
    while (item := stub.pop()) is not None:
        items.append(item)

    def guard(fn: Any) -> Any:
        def run_it() -> None:
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                errors.append(exc)

        return run_it

    jobs = [guard(lambda i=i: stub.deliver(rt, i)) for i in items]
    if extra is not None:
        jobs.append(guard(extra))
    threads = [threading.Thread(target=j) for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return errors


def _fan_out(n: int) -> Any:
    kid = _child(
        {"tool_calls": [call("echo", {"text": "e"}, "e1")]}, {"text": "kid done"}, tools=["echo"]
    )
    calls = [call(f"k{i}", {"input": str(i)}, f"c{i}") for i in range(n)]
    return _parent(
        [{"tool_calls": calls}, {"text": "all done"}],
        *[_tool(f"k{i}", kid) for i in range(n)],
        parallel_tools=n,
    )


@pytest.mark.parametrize("cancel", [False, True])
def test_children_ending_together_on_postgresql(
    pg_rt: Runtime, stub: StubBroker, cancel: bool
) -> None:
    for _ in range(4):
        run_id = submit(pg_rt, _fan_out(4))
        stub.deliver(pg_rt, stub.pop())  # type: ignore[arg-type]  # the parent's round
        assert _deliver_all(pg_rt, stub) == []  # four starts
        assert _deliver_all(pg_rt, stub) == []  # four child rounds → four echo calls
        extra = (lambda rid=run_id: commands.cancel_run(pg_rt, "default", rid)) if cancel else None
        errors = _deliver_all(pg_rt, stub, extra)  # four child joins (+ a cancel), at once
        assert [e for e in errors if not isinstance(e, Conflict)] == []
        stub.drain(pg_rt)
        parent = run(pg_rt, run_id)
        kids = _children_of(pg_rt, run_id)
        assert all(k["status"] in ("completed", "cancelled") for k in kids)
        with pg_rt.engine.connect() as conn:
            statuses = [c["status"] for c in call_store.list_tool_calls(conn, run_id)]
        assert statuses == ["done"] * 4
        if parent["status"] == "completed":
            assert _tool_texts(pg_rt, run_id) == ["kid done"] * 4
        else:
            assert cancel and parent["status"] == "cancelled"
        assert due_work(pg_rt, run_id, *[k["id"] for k in kids]) == 0


def test_a_parent_on_a_thread_ended_by_its_childs_join_releases_the_next_run(
    sqlite_rt: Runtime, stub: StubBroker
) -> None:
    from shared.engine import threads

    threads.create_thread(sqlite_rt, "default", None, "enqueue", "thr_sub")
    spec = _parent(
        [
            {
                "tool_calls": [
                    call("sub", {"input": "x"}, "c1"),
                    call("stop", {"reason": "that is all"}, "s1"),
                ]
            }
        ],
        _tool("sub", _child({"text": "sub answer"})),
        "stop",
    )
    first, _ = commands.submit_run(
        sqlite_rt, commands.RunInput(agent=spec, input="one", thread_id="thr_sub")
    )
    second, _ = commands.submit_run(
        sqlite_rt,
        commands.RunInput(agent=agent([{"text": "second done"}]), input="two", thread_id="thr_sub"),
    )
    assert run(sqlite_rt, second["id"])["held"] is True
    stub.drain(sqlite_rt)
    assert run(sqlite_rt, first["id"])["stop_reason"] == "stop_tool"
    (kid,) = _children_of(sqlite_rt, first["id"])
    assert kid["thread_id"] is None  # a child is not part of the conversation
    assert run(sqlite_rt, second["id"])["result"]["text"] == "second done"


def test_children_started_together_share_the_parents_budget(
    sqlite_rt: Runtime, stub: StubBroker
) -> None:
    # a child's budget is what its parent has left, reserved when it starts, and each call
    # reserves its worst case first (docs/cost.md): three children that each try to spend
    # everything never take the parent past its max_cost
    cheap = {"tiers": [{"input": 0.05, "output": 0.05}]}
    spender = {
        "kind": "agent",
        "tools": ["echo"],
        "max_rounds": 60,
        "force_answer_after": 100,
        "model": _scripted(
            *[{"tool_calls": [call("echo", {"text": "x" * 80}, f"s{i}")]} for i in range(60)],
            pricing=cheap,
        ),
    }
    spec = agent(
        [
            {
                "tool_calls": [
                    call("a", {"input": "spend"}, "c1"),
                    call("b", {"input": "spend"}, "c2"),
                    call("c", {"input": "spend"}, "c3"),
                ]
            },
            {"text": "done"},
        ],
        tools=[_tool("a", spender), _tool("b", spender), _tool("c", spender)],
        parallel_tools=3,
        budget={"max_cost": 0.2},
        model_extra={"pricing": cheap},
    )
    run_id = submit(sqlite_rt, spec, "go")
    stub.drain(sqlite_rt)
    parent = run(sqlite_rt, run_id)
    kids = _children_of(sqlite_rt, run_id)
    with sqlite_rt.engine.connect() as conn:
        ids = [run_id, *[k["id"] for k in kids]]
        costs = (
            conn.execute(sa.select(usage.c.cost).where(usage.c.run_id.in_(ids), usage.c.committed))
            .scalars()
            .all()
        )
    total = sum(costs)
    assert parent["cost"] == pytest.approx(total)
    assert total <= 0.2 + 1e-9, total
    assert sum(1 for k in kids if k["stop_reason"] == "budget_cost") >= 2
    assert len(costs) > 4  # the children did spend: the budget, not a bug, stopped them
