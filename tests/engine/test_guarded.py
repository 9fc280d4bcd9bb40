"""Guarded agent: local routing, reads at once, writes after approval (SPEC N-1..N-5)."""

from __future__ import annotations

import pytest

from shared.agent.approval import ItemDecision
from shared.engine import commands
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.errors import Conflict, SpecError
from tests.engine.helpers import agent, call, model_rounds, run, submit, transcript

REPLIES = [
    {
        "tool_calls": [
            call("echo", {"text": "read it"}, "r1"),
            call("write_thing", {"item": "A"}, "w1"),
            call("write_thing", {"item": "B"}, "w2"),
        ]
    },
    {"text": "Wrote A; B was declined."},
]


def _guarded(**kw: object):  # type: ignore[no-untyped-def]
    return agent(REPLIES, tools=["echo", "write_thing"], guarded=True, parallel_tools=3, **kw)


def _approval_id(rt: Runtime, run_id: str) -> str:
    return str(run(rt, run_id)["pending"]["approval_id"])


def test_router_first_match_wins_and_makes_no_model_call(
    sqlite_rt: Runtime, stub: StubBroker
) -> None:
    # SPEC N-1: ordered rules; specific before general; CJK keywords
    rules = [
        {"any": ["冲突", "conflict"], "all": ["fix"], "handler": "resolve_conflicts"},
        {"any": ["conflict"], "handler": "echo"},
        {"any": ["search"], "pass_to_model": True},
    ]
    specific = submit(
        sqlite_rt,
        agent([{"text": "model"}], guarded=True, router=rules),
        "please FIX the merge 冲突",
    )
    general = submit(
        sqlite_rt, agent([{"text": "model"}], guarded=True, router=rules), "a conflict happened"
    )
    passed = submit(
        sqlite_rt, agent([{"text": "model answer"}], guarded=True, router=rules), "search the docs"
    )
    stub.drain(sqlite_rt)
    a, b, c = (run(sqlite_rt, i) for i in (specific, general, passed))
    assert (a["stop_reason"], b["stop_reason"], c["stop_reason"]) == (
        "routed",
        "routed",
        "completed",
    )
    assert "git status" in a["result"]["text"]
    assert b["result"]["text"] == "Routed locally: a conflict happened"
    assert c["result"]["text"] == "model answer"
    assert model_rounds(sqlite_rt, specific) == 0 and model_rounds(sqlite_rt, general) == 0
    assert model_rounds(sqlite_rt, passed) == 1


def test_reads_run_writes_wait_for_approval(sqlite_rt: Runtime, stub: StubBroker) -> None:
    # SPEC N-2, N-3: the read ran; the run waits with two items; nothing queued
    run_id = submit(sqlite_rt, _guarded())
    stub.drain(sqlite_rt)
    r = run(sqlite_rt, run_id)
    assert r["status"] == "waiting" and r["pending"]["kind"] == "approval"
    items = r["pending"]["items"]
    assert [(i["call_id"], i["tool"]) for i in items] == [
        ("w1", "write_thing"),
        ("w2", "write_thing"),
    ]
    assert items[0]["arguments"] == {"item": "A"} and "write_thing" in items[0]["preview"]
    assert [x[1] for x in transcript(sqlite_rt, run_id) if x[0] == "tool"] == ["read it"]
    assert not stub.queue


def test_approve_one_reject_one_then_a_separate_summary_round(
    sqlite_rt: Runtime, stub: StubBroker, tmp_path, monkeypatch
) -> None:
    # SPEC N-4
    effects = tmp_path / "effects.log"
    monkeypatch.setenv("TREADLE_TEST_EFFECTS", str(effects))
    run_id = submit(sqlite_rt, _guarded())
    stub.drain(sqlite_rt)
    apr = _approval_id(sqlite_rt, run_id)
    commands.approve_run(sqlite_rt, "default", run_id, apr, ["w1"], ["w2"])
    stub.drain(sqlite_rt)
    r = run(sqlite_rt, run_id)
    assert (r["status"], r["result"]["text"]) == ("completed", "Wrote A; B was declined.")
    tools = [x[1] for x in transcript(sqlite_rt, run_id) if x[0] == "tool"]
    assert tools == ["read it", "wrote A", "Declined by user"]
    assert effects.read_text().split() == [f"{run_id}:w1", "A"]
    assert model_rounds(sqlite_rt, run_id) == 2  # the summary is its own model call


def test_approval_is_idempotent_and_409_when_not_waiting(
    sqlite_rt: Runtime, stub: StubBroker
) -> None:
    run_id = submit(sqlite_rt, _guarded())
    stub.drain(sqlite_rt)
    apr = _approval_id(sqlite_rt, run_id)
    with pytest.raises(SpecError):
        commands.approve_run(sqlite_rt, "default", run_id, apr, ["nope"])
    with pytest.raises(Conflict):
        commands.approve_run(sqlite_rt, "default", run_id, "apr_wrong", "all")
    commands.approve_run(sqlite_rt, "default", run_id, apr, "all")
    again = commands.approve_run(sqlite_rt, "default", run_id, apr, "all")
    assert again["id"] == run_id
    stub.drain(sqlite_rt)
    assert run(sqlite_rt, run_id)["status"] == "completed"
    with pytest.raises(Conflict):
        commands.approve_run(sqlite_rt, "default", run_id, "apr_other", "all")


def test_a_different_decision_on_a_decided_approval_is_409(
    sqlite_rt: Runtime, stub: StubBroker
) -> None:
    # SPEC N-4: the same decisions again are idempotent; different ones come too late (409),
    # as a second, different answer to an ask does — never a 200 that is dropped
    run_id = submit(sqlite_rt, _guarded())
    stub.drain(sqlite_rt)
    apr = _approval_id(sqlite_rt, run_id)
    commands.approve_run(sqlite_rt, "default", run_id, apr, ["w1"], ["w2"])
    same = [
        {"approve": ["w1"], "reject": ["w2"]},
        {"approve": ["w1"]},  # an item not approved is rejected: the same decisions
        {
            "decisions": [
                ItemDecision(call_id="w1", action="approve"),
                ItemDecision(call_id="w2", action="reject"),
            ]
        },
    ]
    for kw in same:
        assert commands.approve_run(sqlite_rt, "default", run_id, apr, **kw)["id"] == run_id
    different = [
        {"approve": "all"},
        {"approve": [], "reject": ["w1", "w2"]},
        {"approve": ["w2"]},
        {
            "decisions": [
                ItemDecision(call_id="w1", action="approve"),
                ItemDecision(call_id="w2", action="reject", message="not B"),
            ]
        },
        {
            "decisions": [
                ItemDecision(call_id="w1", action="edit", arguments={"item": "C"}),
                ItemDecision(call_id="w2", action="reject"),
            ]
        },
    ]
    for kw in different:
        with pytest.raises(Conflict, match="already decided otherwise"):
            commands.approve_run(sqlite_rt, "default", run_id, apr, **kw)
    stub.drain(sqlite_rt)
    tools = [x[1] for x in transcript(sqlite_rt, run_id) if x[0] == "tool"]
    assert tools == ["read it", "wrote A", "Declined by user"]  # the first decision stands
    with pytest.raises(Conflict, match="already decided otherwise"):  # after the run ended too
        commands.approve_run(sqlite_rt, "default", run_id, apr, "all")
    assert commands.approve_run(sqlite_rt, "default", run_id, apr, ["w1"])["id"] == run_id


def test_reject_all_runs_the_summary_round(sqlite_rt: Runtime, stub: StubBroker) -> None:
    run_id = submit(sqlite_rt, _guarded())
    stub.drain(sqlite_rt)
    commands.approve_run(
        sqlite_rt, "default", run_id, _approval_id(sqlite_rt, run_id), [], ["w1", "w2"]
    )
    stub.drain(sqlite_rt)
    tools = [x[1] for x in transcript(sqlite_rt, run_id) if x[0] == "tool"]
    assert tools == ["read it", "Declined by user", "Declined by user"]
    assert run(sqlite_rt, run_id)["status"] == "completed"


def test_unknown_kind_counts_as_write(sqlite_rt: Runtime, stub: StubBroker) -> None:
    # SPEC N-5: an inline tool without read_only is a write
    spec = agent(
        [{"tool_calls": [call("mystery", {}, "m1")]}, {"text": "ok"}],
        guarded=True,
        tools=[
            {
                "name": "mystery",
                "description": "?",
                "http": {"method": "GET", "url": "https://example.invalid/x"},
            }
        ],
    )
    run_id = submit(sqlite_rt, spec)
    stub.drain(sqlite_rt)
    r = run(sqlite_rt, run_id)
    assert r["status"] == "waiting" and r["pending"]["items"][0]["tool"] == "mystery"


def test_guarded_default_max_rounds_is_six() -> None:
    assert agent([{"text": "x"}], guarded=True).effective_max_rounds == 6


def test_decisions_edit_reject_with_message_and_the_note(
    sqlite_rt: Runtime, stub: StubBroker
) -> None:
    # N-4: per-item decisions; the model reads what ran, the decline message and the note
    from shared.agent.approval import ItemDecision

    run_id = submit(sqlite_rt, _guarded())
    stub.drain(sqlite_rt)
    commands.approve_run(
        sqlite_rt,
        "default",
        run_id,
        _approval_id(sqlite_rt, run_id),
        decisions=[
            ItemDecision(call_id="w1", action="edit", arguments={"item": "A2"}),
            ItemDecision(call_id="w2", action="reject", message="not B, ever"),
        ],
        note="keep it short",
        by="key_123",
    )
    stub.drain(sqlite_rt)
    r = run(sqlite_rt, run_id)
    assert r["status"] == "completed"
    texts = [x for x in transcript(sqlite_rt, run_id)]
    tools = [t[1] for t in texts if t[0] == "tool"]
    assert tools[1].startswith("The user edited the arguments before approving; ran with")
    assert '"A2"' in tools[1]
    assert tools[2] == "Declined by user: not B, ever"
    # the note comes after the batch's tool messages, before the summary round's reply
    roles = [t[0] for t in texts]
    assert texts[roles.index("assistant", 2) - 1][1] == "Note from the approver: keep it short"
    from shared.store import calls as call_store
    from shared.store import records

    with sqlite_rt.engine.connect() as conn:
        calls = {c.call_id: c for c in call_store.list_tool_calls(conn, run_id)}
        resumed = [e for e in records.list_events(conn, run_id) if e["type"] == "run.resumed"]
    assert calls["w1"].arguments == '{"item": "A2"}'
    decision = (calls["w1"].data or {})["decision"]
    assert decision["by"] == "key_123" and decision["proposed_arguments"] == {"item": "A"}
    assert resumed[-1]["data"]["by"] == "key_123"
    assert [d["action"] for d in resumed[-1]["data"]["decisions"]] == ["edit", "reject"]


def test_an_edit_that_breaks_the_schema_is_refused_and_changes_nothing(
    sqlite_rt: Runtime, stub: StubBroker
) -> None:
    from shared.agent.approval import ItemDecision

    run_id = submit(sqlite_rt, _guarded())
    stub.drain(sqlite_rt)
    before = run(sqlite_rt, run_id)
    with pytest.raises(SpecError, match="Invalid arguments for write_thing"):
        commands.approve_run(
            sqlite_rt,
            "default",
            run_id,
            _approval_id(sqlite_rt, run_id),
            decisions=[ItemDecision(call_id="w1", action="edit", arguments={"item": 7})],
        )
    after = run(sqlite_rt, run_id)
    assert (after["status"], after["version"]) == (before["status"], before["version"])
