"""kind: agent — the multi-round loop with durable tool fan-out (SPEC L-*), on the stub broker."""

from __future__ import annotations

import json

import sqlalchemy as sa

from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.store import records
from shared.store.tables import messages, tool_calls
from tests.engine.helpers import agent, call, model_rounds, run, submit, transcript

TOOLS = ["echo", "boom", "sleepy", "big", "priced"]


def test_four_round_transcript_exactly_as_spec(sqlite_rt: Runtime, stub: StubBroker) -> None:
    # SPEC L-4 (call order), L-5 (errors are data)
    spec = agent(
        [
            {
                "tool_calls": [
                    call("echo", {"text": "a"}, "c1"),
                    call("echo", {"text": "b"}, "c2"),
                    call("echo", {"text": "c"}, "c3"),
                ]
            },
            {"tool_calls": [call("boom", {}, "c4")]},
            {"tool_calls": [call("nope", {}, "c5"), call("echo", '{"text": ', "c6")]},
            {"text": "All done."},
        ],
        tools=TOOLS,
        parallel_tools=3,
    )
    run_id = submit(sqlite_rt, spec)
    stub.drain(sqlite_rt)
    r = run(sqlite_rt, run_id)
    assert (r["status"], r["stop_reason"], r["round"]) == ("completed", "completed", 4)
    assert r["result"]["text"] == "All done."
    t = transcript(sqlite_rt, run_id)
    assert [x[0] for x in t] == [
        "user",
        "assistant",
        "tool",
        "tool",
        "tool",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "tool",
        "assistant",
    ]
    assert [x[1] for x in t if x[0] == "tool"][:3] == ["a", "b", "c"]
    assert t[6][1] == "Tool error: the flux capacitor is cold"
    assert t[8][1] == "Tool not found: nope"
    assert t[9][1].startswith("Invalid arguments for echo: ")
    assert model_rounds(sqlite_rt, run_id) == 4


def test_tool_messages_in_call_order_whatever_finished_first(
    sqlite_rt: Runtime, stub: StubBroker
) -> None:
    # SPEC L-4: appended in the order the model made the calls
    spec = agent(
        [
            {
                "tool_calls": [
                    call("echo", {"text": "first"}, "x1"),
                    call("echo", {"text": "second"}, "x2"),
                ]
            },
            {"text": "ok"},
        ],
        tools=TOOLS,
        parallel_tools=2,
    )
    run_id = submit(sqlite_rt, spec)
    round_msg = stub.pop()
    stub.deliver(sqlite_rt, round_msg)  # type: ignore[arg-type]
    first, second = stub.pop(), stub.pop()
    stub.deliver(sqlite_rt, second)  # type: ignore[arg-type]  # x2 finishes first
    stub.deliver(sqlite_rt, first)  # type: ignore[arg-type]
    stub.drain(sqlite_rt)
    tools = [x[1] for x in transcript(sqlite_rt, run_id) if x[0] == "tool"]
    assert tools == ["first", "second"]


def test_serial_batch_queues_one_call_at_a_time(sqlite_rt: Runtime, stub: StubBroker) -> None:
    # SPEC L-4: parallel_tools=1 (tool agent default) runs calls one after another
    spec = agent(
        [
            {"tool_calls": [call("echo", {"text": str(i)}, f"s{i}") for i in range(3)]},
            {"text": "ok"},
        ],
        tools=TOOLS,
    )
    submit(sqlite_rt, spec)
    stub.deliver(sqlite_rt, stub.pop())  # type: ignore[arg-type]
    assert [d.kind for d in stub.queue] == ["tool"]
    stub.deliver(sqlite_rt, stub.pop())  # type: ignore[arg-type]
    assert [d.kind for d in stub.queue] == ["tool"]


def test_duplicate_tool_message_runs_the_tool_once(sqlite_rt: Runtime, stub: StubBroker) -> None:
    spec = agent([{"tool_calls": [call("echo", {"text": "x"}, "d1")]}, {"text": "ok"}], tools=TOOLS)
    run_id = submit(sqlite_rt, spec)
    stub.deliver(sqlite_rt, stub.pop())  # type: ignore[arg-type]
    tool_msg = stub.pop()
    assert stub.deliver(sqlite_rt, tool_msg) == "committed"  # type: ignore[arg-type]
    assert stub.deliver(sqlite_rt, tool_msg) == "stale"  # type: ignore[arg-type]
    stub.drain(sqlite_rt)
    assert run(sqlite_rt, run_id)["status"] == "completed"
    with sqlite_rt.engine.connect() as conn:
        attempts = conn.execute(sa.select(tool_calls.c.attempts)).scalars().all()
    assert attempts == [1]


def test_stop_tool_ends_without_another_model_call(sqlite_rt: Runtime, stub: StubBroker) -> None:
    # SPEC L-6 and L-4 (calls after the stop are skipped)
    spec = agent(
        [
            {
                "tool_calls": [
                    call("echo", {"text": "before"}, "a"),
                    call("stop", {"reason": "done"}, "b"),
                    call("echo", {"text": "after"}, "c"),
                ]
            },
            {"text": "never"},
        ],
        tools=[*TOOLS, "stop"],
    )
    run_id = submit(sqlite_rt, spec)
    stub.drain(sqlite_rt)
    r = run(sqlite_rt, run_id)
    assert (r["status"], r["stop_reason"]) == ("completed", "stop_tool")
    tools = [x[1] for x in transcript(sqlite_rt, run_id) if x[0] == "tool"]
    assert tools[0] == "before" and tools[1] == "Stopped." and tools[2].startswith("Skipped")
    assert model_rounds(sqlite_rt, run_id) == 1


LOOP = [{"text": "", "tool_calls": [call("echo", {"text": "again"})]}]


def test_max_rounds_stop_reason_with_last_text(sqlite_rt: Runtime, stub: StubBroker) -> None:
    # SPEC L-2: ends completed with stop_reason max_rounds and the last answer text
    replies = [
        {"text": "thinking aloud", "tool_calls": [call("echo", {"text": str(i)})]}
        for i in range(10)
    ]
    run_id = submit(sqlite_rt, agent(replies, tools=TOOLS, max_rounds=3))
    stub.drain(sqlite_rt)
    r = run(sqlite_rt, run_id)
    assert (r["status"], r["stop_reason"], r["round"]) == ("completed", "max_rounds", 3)
    assert r["result"]["text"] == "thinking aloud"
    assert model_rounds(sqlite_rt, run_id) == 3


def test_final_answer_on_limit_makes_one_last_call(sqlite_rt: Runtime, stub: StubBroker) -> None:
    replies = [{"tool_calls": [call("echo", {"text": str(i)})]} for i in range(2)]
    replies.append({"text": "final answer"})
    run_id = submit(
        sqlite_rt, agent(replies, tools=TOOLS, max_rounds=2, final_answer_on_limit=True)
    )
    stub.drain(sqlite_rt)
    r = run(sqlite_rt, run_id)
    assert (r["stop_reason"], r["result"]["text"]) == ("max_rounds", "final answer")
    assert model_rounds(sqlite_rt, run_id) == 3


def test_budget_max_cost(sqlite_rt: Runtime, stub: StubBroker) -> None:
    # SPEC L-9 and L-10: tool costs count; a hard cap checked before every model call
    replies = [{"tool_calls": [call("priced", {"cost": 0.4})]} for _ in range(10)]
    run_id = submit(sqlite_rt, agent(replies, tools=TOOLS, budget={"max_cost": 1.0}))
    stub.drain(sqlite_rt)
    r = run(sqlite_rt, run_id)
    assert (r["status"], r["stop_reason"]) == ("completed", "budget_cost")
    assert r["cost"] >= 1.0 and model_rounds(sqlite_rt, run_id) == 3


def test_budget_max_tool_calls(sqlite_rt: Runtime, stub: StubBroker) -> None:
    replies = [
        {"tool_calls": [call("echo", {"text": "x"}), call("echo", {"text": "y"})]}
        for _ in range(10)
    ]
    run_id = submit(
        sqlite_rt, agent(replies, tools=TOOLS, parallel_tools=2, budget={"max_tool_calls": 3})
    )
    stub.drain(sqlite_rt)
    r = run(sqlite_rt, run_id)
    assert r["stop_reason"] == "budget_tool_calls" and model_rounds(sqlite_rt, run_id) == 2


def test_budget_deadline(sqlite_rt: Runtime, stub: StubBroker) -> None:
    replies = [{"tool_calls": [call("sleepy", {"seconds": 0.4})]} for _ in range(10)]
    run_id = submit(sqlite_rt, agent(replies, tools=TOOLS, budget={"deadline_s": 1.0}))
    stub.drain(sqlite_rt)
    r = run(sqlite_rt, run_id)
    assert (r["status"], r["stop_reason"]) == ("completed", "budget_deadline")
    assert 1 <= model_rounds(sqlite_rt, run_id) <= 4  # 0.4 s a round; fewer under load


def test_one_megabyte_result_stored_whole_model_sees_it_reduced(
    sqlite_rt: Runtime, stub: StubBroker
) -> None:
    # SPEC L-7
    spec = agent(
        [{"tool_calls": [call("big", {"size": 1_000_000}, "b1")]}, {"text": "ok"}], tools=TOOLS
    )
    run_id = submit(sqlite_rt, spec)
    stub.drain(sqlite_rt)
    with sqlite_rt.engine.connect() as conn:
        row = conn.execute(sa.select(tool_calls)).mappings().one()
        msg = conn.execute(sa.select(messages).where(messages.c.role == "tool")).mappings().one()
    assert len(row["result"]) == 1_000_000
    assert "[... truncated" in msg["content"] and len(msg["content"]) < 200_000
    assert run(sqlite_rt, run_id)["status"] == "completed"


def test_context_checkpoint_when_history_passes_80_percent(
    sqlite_rt: Runtime, stub: StubBroker
) -> None:
    # SPEC L-8: a <context_checkpoint> is written and the run continues from it
    long = "x" * 1200
    replies = [{"tool_calls": [call("echo", {"text": f"{i} {long}"})]} for i in range(8)]
    replies.append({"text": "finished"})
    spec = agent(replies, tools=TOOLS, model_extra={"context_window": 2000, "max_tokens": 200})
    run_id = submit(sqlite_rt, spec)
    stub.drain(sqlite_rt)
    r = run(sqlite_rt, run_id)
    assert (r["status"], r["result"]["text"]) == ("completed", "finished")
    assert model_rounds(sqlite_rt, run_id, "compress") >= 1
    assert r["view_start"] > 0
    with sqlite_rt.engine.connect() as conn:
        ckpts = [
            m for m in records.list_messages(conn, run_id) if m["kind"] == "context_checkpoint"
        ]
    assert ckpts and "<context_checkpoint>" in ckpts[-1]["content"]
    assert model_rounds(sqlite_rt, run_id) == 9


def test_bytes_written_per_round_do_not_grow(sqlite_rt: Runtime, stub: StubBroker) -> None:
    # flat writes per round: round 60 writes within 1.2x of round 5 (rows x sizes)
    text = "y" * 500
    replies = [
        {"text": "", "tool_calls": [call("echo", {"text": f"{i:03d} {text}"})]} for i in range(70)
    ]
    run_id = submit(sqlite_rt, agent(replies, tools=TOOLS, max_rounds=65, force_answer_after=1000))
    stub.drain(sqlite_rt)
    with sqlite_rt.engine.connect() as conn:
        rows = conn.execute(sa.select(messages).where(messages.c.run_id == run_id)).mappings().all()
        calls = conn.execute(sa.select(tool_calls)).mappings().all()

    def written(round_: int) -> int:
        msg = sum(len(json.dumps(dict(m), default=str)) for m in rows if m["round"] == round_)
        tc = sum(len(json.dumps(dict(c), default=str)) for c in calls if c["round"] == round_)
        return msg + tc

    assert written(60) <= 1.2 * written(5), (written(5), written(60))
