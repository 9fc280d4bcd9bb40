"""The terminal side of the CLI without a server: the watcher's state (events + snapshots),
the append-only terminal log, the line-mode pickers, and the CLI's small helpers."""

from __future__ import annotations

import io
import re
from typing import Any

import pytest
from rich.console import Console

from scheduler.cli import prompts
from scheduler.cli.client import Event, _event_of
from scheduler.cli.decisions import FlagError, flag_decisions
from scheduler.cli.interactive import approval_choices, decide_approval
from scheduler.cli.livestate import LiveRun
from scheduler.cli.runs import exit_code
from scheduler.cli.watch import RunPanel, model_name

RUN = {
    "id": "run_1",
    "status": "running",
    "round": 1,
    "kind": "agent",
    "plan": None,
    "pending": None,
    "usage": {"input_tokens": 10, "output_tokens": 5, "cost": 0.0},
    "agent": {"kind": "agent", "model": "demo"},
    "metadata": None,
    "created_at": "2026-01-01T00:00:00Z",
    "updated_at": "2026-01-01T00:00:01Z",
}
USER = {
    "seq": 1,
    "round": 0,
    "role": "user",
    "content": "Add 2 and 2",
    "reasoning": None,
    "tool_calls": [],
    "tool_call_id": None,
    "name": None,
    "hidden": False,
    "kind": None,
}


def _assistant(n: int, text: str = "", reasoning: str = "") -> dict[str, Any]:
    return {
        **USER,
        "seq": n + 1,
        "round": n,
        "role": "assistant",
        "content": text,
        "reasoning": reasoning,
    }


def _call(status: str, result: str | None = None) -> dict[str, Any]:
    return {
        "call_id": "c1",
        "round": 1,
        "name": "calculator",
        "arguments": '{"expression": "2+2"}',
        "status": status,
        "result": result,
        "error": None,
        "cost": 0.0,
        "started_at": "1970-01-01T00:01:40Z",
        "finished_at": "1970-01-01T00:01:40.500000Z" if status == "done" else None,
        "attempts": 1,
    }


USAGE = [
    {
        "round": 1,
        "purpose": "round",
        "input_tokens": 10,
        "output_tokens": 5,
        "cost": 0.0,
        "latency_ms": 12,
    }
]


def test_deltas_stream_into_the_round_until_it_is_stored() -> None:
    state = LiveRun("run_1")
    state.sync(RUN, [USER], [], [])
    assert state.apply(Event("round.started", {"round": 1}, seq=2)) is False
    state.apply(Event("reasoning.delta", {"text": "Adding.", "round": 1}))
    state.apply(Event("text.delta", {"text": "It is ", "round": 1}))
    state.apply(Event("text.delta", {"text": "4", "round": 1}))
    [view] = state.rounds()
    assert (view.n, view.text, view.reasoning, view.streaming) == (1, "It is 4", "Adding.", True)
    assert state.cursor == 2
    state.sync({**RUN, "status": "completed"}, [USER, _assistant(1, "It is 4.")], [], USAGE)
    [view] = state.rounds()
    assert (view.text, view.streaming, view.usage) == ("It is 4.", False, USAGE[0])
    assert state.question() == "Add 2 and 2"


def test_tool_started_shows_before_the_snapshot_has_it() -> None:
    state = LiveRun("run_1")
    state.sync(RUN, [USER, _assistant(1)], [], USAGE)
    assert (
        state.apply(Event("tool.started", {"call_id": "c1", "name": "calculator"}, seq=3, ts=100.0))
        is True
    )  # a fetch brings its arguments
    [view] = state.rounds()
    assert [(t.name, t.status) for t in view.tools] == [("calculator", "running")]
    assert state.apply(Event("tool.finished", {"call_id": "c1"}, seq=4)) is True
    state.sync(RUN, [USER, _assistant(1)], [_call("done", "4")], USAGE)
    [tool] = state.rounds()[0].tools
    assert (tool.status, tool.preview, tool.seconds()) == ("done", "4", 0.5)


def test_internal_tools_are_not_cards_and_declines_are_marked() -> None:
    state = LiveRun("run_1")
    ask = {**_call("done", "## Q\nAnswer: x"), "call_id": "a", "name": "ask_user"}
    declined = {**_call("done", "Declined by user"), "call_id": "w", "name": "save_note"}
    state.sync(RUN, [USER, _assistant(1)], [ask, declined], USAGE)
    [tool] = state.rounds()[0].tools
    assert tool.name == "save_note" and tool.declined


def _panel(state: LiveRun) -> tuple[RunPanel, io.StringIO]:
    out = io.StringIO()
    return RunPanel(state, Console(file=out, width=100, color_system=None)), out


def test_terminal_log_prints_each_round_and_tool_once() -> None:
    state = LiveRun("run_1")
    panel, out = _panel(state)
    state.sync(RUN, [USER, _assistant(1, reasoning="Need a tool.")], [_call("running")], USAGE)
    panel.flush()
    assert "Add 2 and 2" in out.getvalue() and "round 1" not in out.getvalue()  # still current
    state.apply(Event("round.started", {"round": 2}, seq=5))
    state.sync(
        {**RUN, "round": 1},
        [USER, _assistant(1, reasoning="Need a tool.")],
        [_call("done", "4")],
        USAGE,
    )
    panel.flush()
    panel.flush()
    text = out.getvalue()
    assert text.count("round 1") == 1 and text.count("calculator") == 1
    assert "Need a tool." in text and "→ 4" in text


def test_waiting_round_is_printed_and_its_tool_line_comes_after_the_decision() -> None:
    state = LiveRun("run_1")
    panel, out = _panel(state)
    waiting = {
        **RUN,
        "status": "waiting",
        "pending": {"kind": "approval", "approval_id": "a", "items": []},
    }
    state.sync(waiting, [USER, _assistant(1, "Saving now.")], [_call("waiting")], USAGE)
    panel.flush()
    assert "Saving now." in out.getvalue() and "calculator" not in out.getvalue()
    tail = Console(file=io.StringIO(), width=100, color_system=None)
    tail.print(panel.tail())
    assert "calculator" in tail.file.getvalue()  # type: ignore[attr-defined]
    state.sync(
        {**RUN, "status": "completed"},
        [USER, _assistant(1, "Saving now.")],
        [_call("done", "saved")],
        USAGE,
    )
    panel.flush()
    assert out.getvalue().count("Saving now.") == 1 and "→ saved" in out.getvalue()


def test_event_parsing_tells_durable_from_live() -> None:
    durable = _event_of(
        "tool.started",
        '{"seq": 7, "run_id": "r", "type": "tool.started", "data": {"call_id": "c"}, '
        '"ts": "1970-01-01T00:00:01.500000Z"}',
    )
    assert (durable.seq, durable.data, durable.ts) == (7, {"call_id": "c"}, 1.5)
    live = _event_of("text.delta", '{"run_id": "r", "text": "hi", "round": 2}')
    assert live.seq is None and live.data["text"] == "hi"


def test_line_mode_pickers(monkeypatch: pytest.MonkeyPatch) -> None:
    console = Console(file=io.StringIO(), width=100)
    choices = [prompts.Choice("Alpha", "a"), prompts.Choice("Beta", "b")]
    monkeypatch.setattr("sys.stdin", io.StringIO("2\n"))
    assert prompts.choose(console, "Pick", choices, other="Other") == "b"
    monkeypatch.setattr("sys.stdin", io.StringIO("3\nmy own words\n"))
    assert prompts.choose(console, "Pick", choices, other="Other") == "my own words"
    monkeypatch.setattr("sys.stdin", io.StringIO("\n"))
    assert prompts.checklist(console, "Approve", choices) == [True, True]
    monkeypatch.setattr("sys.stdin", io.StringIO("2\n"))
    assert prompts.checklist(console, "Approve", choices) == [False, True]
    monkeypatch.setattr("sys.stdin", io.StringIO("none\n"))
    assert prompts.checklist(console, "Approve", choices) == [False, False]


def test_cli_helpers() -> None:
    assert [
        exit_code({"status": s}) for s in ("completed", "failed", "cancelled", "waiting", "running")
    ] == [0, 1, 1, 3, 0]
    ids = ["c1", "c2", "c3"]

    def actions(every: bool, yes: list[str], no: list[str], edit: list[str] = []) -> list[str]:  # noqa: B006
        return [d["action"] for d in flag_decisions(ids, every, yes, no, edit)]

    assert actions(True, [], []) == ["approve"] * 3
    assert actions(False, ["c2"], []) == ["reject", "approve", "reject"]
    assert actions(False, [], ["c1"]) == ["reject", "approve", "approve"]
    assert actions(True, [], ["c3"]) == ["approve", "approve", "reject"]
    assert actions(False, [], [], ['c1={"a": 1}']) == ["edit", "reject", "reject"]
    assert actions(True, [], [], ['c1={"a": 1}']) == ["edit", "approve", "approve"]
    assert model_name({"model": "demo"}) == "demo"
    assert model_name({"model": {"name": "inline", "model": "gpt-x"}}) == "gpt-x"
    pending = {"items": [{"call_id": "c1", "tool": "save_note", "arguments": {"title": "T"}}]}
    [choice] = approval_choices(pending)
    assert (choice.label, choice.value) == ("save_note", "c1") and '"title": "T"' in choice.full


def test_print_run_shows_warnings_the_plan_and_the_question() -> None:
    from scheduler.cli.render import print_run

    run = {
        **RUN,
        "status": "waiting",
        "warnings": ["tool 'ask_user' has an internal tool's name and was removed"],
        "plan": {
            "name": "Trip",
            "steps": [
                {"id": "s1", "name": "Pick dates", "status": "done", "note": "May"},
                {"id": "s2", "name": "Book", "status": "pending"},
            ],
        },
        "pending": {
            "kind": "ask",
            "reason": "Need the kind of trip",
            "questions": [
                {
                    "question": "Which trip?",
                    "options": [{"label": "City", "value": "c"}, {"label": "Beach", "value": "b"}],
                }
            ],
        },
    }
    out = io.StringIO()
    print_run(Console(file=out, width=100), run)
    text = out.getvalue()
    assert "warning: tool 'ask_user' has an internal tool's name and was removed" in text
    assert "plan: Trip" in text and "✔ Pick dates  — May" in text and "○ Book" in text
    assert "Which trip?" in text and "City · Beach" in text


def test_approve_flags_carry_messages_and_edits() -> None:
    ids = ["c1", "c=2", "c3"]
    decided = flag_decisions(ids, True, [], ["c1=not today, thanks", "c3"], ['c=2={"x": [1]}'])
    assert decided == [
        {"call_id": "c1", "action": "reject", "message": "not today, thanks"},
        {"call_id": "c=2", "action": "edit", "arguments": {"x": [1]}},
        {"call_id": "c3", "action": "reject"},
    ]
    for bad, why in [
        ((["c9"], [], []), "unknown call id 'c9'"),
        (([], [], ["c1"]), "give the arguments"),
        (([], [], ["c1={x"]), "not JSON"),
        (([], [], ["c1=[1]"]), "must be a JSON object"),
        ((["c1"], ["c1"], []), "one decision per call: c1 (--approve and --reject)"),
        ((["c1=x"], [], []), "--approve takes a call id only"),
    ]:
        with pytest.raises(FlagError, match=re.escape(why)):
            flag_decisions(ids, False, *bad)


def test_the_checklist_asks_why_for_each_rejected_write(monkeypatch: pytest.MonkeyPatch) -> None:
    pending = {
        "items": [
            {"call_id": "c1", "tool": "save_note", "arguments": {"title": "A"}},
            {"call_id": "c2", "tool": "save_note", "arguments": {"title": "B"}},
            {"call_id": "c3", "tool": "save_note", "arguments": {"title": "C"}},
        ]
    }
    console = Console(file=io.StringIO(), width=100)
    monkeypatch.setattr("sys.stdin", io.StringIO("2\nnot A\n\n"))  # keep c2; why for c1, c3
    assert decide_approval(console, pending) == [
        {"call_id": "c1", "action": "reject", "message": "not A"},
        {"call_id": "c2", "action": "approve"},
        {"call_id": "c3", "action": "reject"},
    ]
