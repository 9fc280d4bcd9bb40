"""SPEC L-8: a compression that fails is billed, said, and not tried again every round.

Before, a compression whose reply was empty kept the messages (as L-8 says) but its call was
neither in ``/usage`` nor in the run's cost, and the next round tried again: a model that
cannot summarise made every round of a long run pay two calls, one of them unbilled. Real
HTTP (the fake OpenAI-compatible server); the stub broker drives the rounds."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from shared.agent.compression import (
    CHECKPOINT_SYSTEM_PROMPT,
    RETRY_GROWTH,
    compression_due,
    compression_retry_at,
)
from shared.agent.spec import AgentSpec
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.llm.fake_server import FakeLLMServer, ReplySpec
from shared.store.tables import events, usage
from shared.vocab import EventType
from tests.engine.helpers import run, submit

WINDOW, MAX_TOKENS = 2000, 200
ROUNDS = 14
BIG_INPUT = "The brief, in full: " + "lorem ipsum dolor sit amet " * 270  # past 80 % at once


class Summariser:
    """A model that calls ``echo`` each round and answers after ``ROUNDS``; its summaries
    come back empty until ``fail`` of them have (then a real one)."""

    def __init__(self, fail: int) -> None:
        self.fail = fail
        self.compressions = 0

    def __call__(self, body: dict[str, Any]) -> ReplySpec:
        messages = body["messages"]
        if messages[0]["role"] == "system" and messages[0]["content"] == CHECKPOINT_SYSTEM_PROMPT:
            self.compressions += 1
            if self.compressions <= self.fail:
                return ReplySpec(text="")
            return ReplySpec(text="<context_checkpoint>1. Goal: echo.</context_checkpoint>")
        done = sum(1 for m in messages if m["role"] == "tool")
        if done >= ROUNDS:
            return ReplySpec(text="finished")
        call = {"id": f"c{done}", "name": "echo", "arguments": {"text": f"r{done}"}}
        return ReplySpec(tool_calls=[call])


@pytest.fixture
def llm() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as server:
        yield server


def _spec(llm: FakeLLMServer) -> AgentSpec:
    model = {
        "provider": "openai",
        "base_url": llm.base_url,
        "model": "fake-1",
        "context_window": WINDOW,
        "max_tokens": MAX_TOKENS,
        "pricing": {"tiers": [{"input": 1.0, "output": 2.0}]},
    }
    body = {"kind": "agent", "model": model, "tools": ["echo"], "max_rounds": ROUNDS + 5}
    return AgentSpec.model_validate({**body, "force_answer_after": 100})


def _usage(rt: Runtime, run_id: str) -> list[dict[str, Any]]:
    with rt.engine.connect() as conn:
        rows = conn.execute(sa.select(usage).where(usage.c.run_id == run_id).order_by(usage.c.id))
        return [dict(r) for r in rows.mappings()]


def _events(rt: Runtime, run_id: str, kind: EventType) -> list[dict[str, Any]]:
    with rt.engine.connect() as conn:
        rows = conn.execute(
            sa.select(events.c.data).where(events.c.run_id == run_id, events.c.type == kind.value)
        ).scalars()
        return [json.loads(d) if isinstance(d, str) else d for d in rows]


def test_a_failing_compression_is_billed_said_and_not_tried_every_round(
    sqlite_rt: Runtime, stub: StubBroker, llm: FakeLLMServer
) -> None:
    model = Summariser(fail=ROUNDS * 2)  # it never summarises
    llm.responder = model
    run_id = submit(sqlite_rt, _spec(llm), BIG_INPUT)
    stub.drain(sqlite_rt)
    r = run(sqlite_rt, run_id)
    assert (r["status"], r["result"]["text"]) == ("completed", "finished")
    rows = _usage(sqlite_rt, run_id)
    compress = [u for u in rows if u["purpose"] == "compress"]
    # every compression the model saw is billed, and there were far fewer than rounds
    assert len(compress) == model.compressions
    assert 1 <= model.compressions <= 3, model.compressions
    assert all(u["cost"] > 0 for u in compress)
    assert r["cost"] == pytest.approx(sum(u["cost"] or 0.0 for u in rows))
    warned = _events(sqlite_rt, run_id, EventType.CONTEXT_UNCOMPRESSED)
    assert len(warned) == model.compressions
    assert all(w["level"] == "warning" and w["billed"] is True for w in warned)
    assert all(w["retry_at"] == compression_retry_at(w["tokens"], WINDOW) for w in warned)
    assert r["view_start"] == 0  # no checkpoint: the messages were kept


def test_after_a_failure_the_next_due_compression_makes_the_checkpoint(
    sqlite_rt: Runtime, stub: StubBroker, llm: FakeLLMServer
) -> None:
    model = Summariser(fail=1)
    llm.responder = model
    run_id = submit(sqlite_rt, _spec(llm), BIG_INPUT)
    stub.drain(sqlite_rt)
    r = run(sqlite_rt, run_id)
    assert r["status"] == "completed"
    assert model.compressions == 2  # the failed one, then one once the messages had grown
    assert r["view_start"] > 0 and r["loop"]["compress_failed_at"] == 0
    assert len(_events(sqlite_rt, run_id, EventType.CONTEXT_UNCOMPRESSED)) == 1


def test_compression_is_due_again_only_after_growth() -> None:
    step = int(WINDOW * RETRY_GROWTH)
    assert compression_due(1700, 0, WINDOW)
    assert not compression_due(1700, 1700, WINDOW)
    assert not compression_due(1700 + step - 1, 1700, WINDOW)
    assert compression_due(1700 + step, 1700, WINDOW)
