"""Reply shapes through the engine (stub broker, strict scripted model): whatever one reply
mixes, each tool call gets exactly one tool message, no call row is left open, and the run
ends. The per-call outcomes are tested on the pure step (tests/unit/test_agent_reply_shapes)."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import pytest

from shared.engine import commands
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.store import calls as call_store
from shared.store import records
from tests.engine.helpers import agent, call, run, submit

KINDS: dict[str, tuple[str, dict[str, Any]]] = {
    "R": ("echo", {"text": "read"}),
    "W": ("write_thing", {"item": "A"}),
    "A": ("ask_user", {"question": "Which?", "options": ["x", "y"]}),
    "S": ("stop", {"reason": "enough"}),
    "P": ("set_plan", {"name": "Trip", "steps": ["go"]}),
    "U": ("no_such_tool", {}),
}
SHAPES = [" ".join(p) for n in (1, 2) for p in itertools.product("RWASPU", repeat=n)] + [
    "R W A W",
    "W R S",
    "P W R A",
]


def _spec(shape: str) -> Any:
    calls = [call(*KINDS[k], f"c{i}{k}") for i, k in enumerate(shape.split())]
    return agent(
        [{"tool_calls": calls}, {"text": "done"}],
        tools=["echo", "write_thing", "stop"],
        guarded=True,
        plan=True,
        ask=True,
        parallel_tools=3,
    )


def _resolve_pauses(rt: Runtime, stub: StubBroker, run_id: str) -> None:
    for _ in range(5):
        stub.drain(rt)
        r = run(rt, run_id)
        if r["status"] != "waiting":
            return
        pending = r["pending"]
        if pending["kind"] == "ask":
            commands.answer_run(rt, "default", run_id, pending["ask_id"], ["x"])
        else:
            commands.approve_run(rt, "default", run_id, pending["approval_id"], "all")


@pytest.mark.parametrize("shape", SHAPES)
def test_every_call_gets_exactly_one_tool_message(
    sqlite_rt: Runtime, stub: StubBroker, shape: str, tmp_path: Any, monkeypatch: Any
) -> None:
    monkeypatch.setenv("TREADLE_TEST_EFFECTS", str(tmp_path / "effects.log"))
    run_id = submit(sqlite_rt, _spec(shape))
    _resolve_pauses(sqlite_rt, stub, run_id)
    r = run(sqlite_rt, run_id)
    assert r["status"] == "completed", (r["status"], r["error"])
    with sqlite_rt.engine.connect() as conn:
        messages = records.list_messages(conn, run_id)
        rows = call_store.list_tool_calls(conn, run_id)
    asked = [c["id"] for m in messages for c in m["tool_calls"] or []]
    answered = Counter(m["tool_call_id"] for m in messages if m["role"] == "tool")
    assert sorted(answered) == sorted(asked) and set(answered.values()) == {1}
    assert {row["status"] for row in rows} == {"done"} and all(row["flushed"] for row in rows)
    expected = "stop_tool" if "S" in shape.split() and not _ask_first(shape) else "completed"
    assert r["stop_reason"] == expected


def _ask_first(shape: str) -> bool:
    """Whether a valid ask halts the reply before any stop (the stop is then skipped)."""
    kinds = shape.split()
    return "A" in kinds and ("S" not in kinds or kinds.index("A") < kinds.index("S"))
