"""Every row of the reply-shape table (README, "Reply shapes") through real Celery workers
(PostgreSQL + Redis) against the strict fake OpenAI-compatible server, which answers 400 to a
request with an assistant tool call and no tool message, as OpenAI does. All the shapes run at
once; pauses are answered and approved over the API. Each run must complete with every call
answered exactly once, and the server must never have refused a transcript."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from fastapi.testclient import TestClient

from scheduler.app import create_app
from shared.engine.runtime import Runtime
from shared.llm.fake_server import FakeLLMServer, ReplySpec
from tests.engine.test_reply_shapes import KINDS, SHAPES, _ask_first
from tests.support import WorkerProcs

PREFIX = "shape: "


def _reply(body: dict[str, Any]) -> ReplySpec:
    """Round 1 of a run: the tool calls its shape names (read from the first user message);
    any later round: the answer."""
    msgs = body["messages"]
    first = next(m for m in msgs if m["role"] == "user")
    shape = str(first["content"]).removeprefix(PREFIX)
    if any(m["role"] == "assistant" for m in msgs):
        return ReplySpec(text="done")
    calls = [
        {"id": f"c{i}{k}", "name": KINDS[k][0], "arguments": KINDS[k][1]}
        for i, k in enumerate(shape.split())
    ]
    return ReplySpec(tool_calls=calls)


def _resolve(client: TestClient, run: dict[str, Any]) -> None:
    pending = run["pending"]
    if pending["kind"] == "ask":
        body = {"ask_id": pending["ask_id"], "answers": ["x"]}
        client.post(f"/v1/runs/{run['id']}/answer", json=body)
    elif pending["kind"] == "approval":
        body = {"approval_id": pending["approval_id"], "approve": "all"}
        client.post(f"/v1/runs/{run['id']}/approval", json=body)


def test_every_reply_shape_through_workers_against_the_strict_fake(
    prod_rt: Runtime, workers: WorkerProcs
) -> None:
    workers.start_many(["alpha", "beta"], concurrency=8)
    with FakeLLMServer(_reply) as llm, TestClient(create_app(lambda: prod_rt)) as client:
        model = {"provider": "openai", "base_url": llm.base_url, "model": "m"}
        spec = {
            "kind": "agent",
            "model": model,
            "tools": ["echo", "write_thing", "stop"],
            "guarded": True,
            "plan": True,
            "ask": True,
            "parallel_tools": 3,
        }
        ids: dict[str, str] = {}
        for shape in SHAPES:
            made = client.post("/v1/runs", json={"agent": spec, "input": PREFIX + shape})
            assert made.status_code == 201, made.text
            ids[shape] = made.json()["id"]
        final: dict[str, dict[str, Any]] = {}
        deadline = time.monotonic() + 180
        while len(final) < len(ids) and time.monotonic() < deadline:
            for shape, run_id in ids.items():
                if shape in final:
                    continue
                run = client.get(f"/v1/runs/{run_id}").json()
                if run["status"] in ("completed", "failed", "cancelled"):
                    final[shape] = run
                elif run["status"] == "waiting":
                    _resolve(client, run)
            time.sleep(0.2)
        assert len(final) == len(ids), sorted(set(ids) - set(final))
        transcripts = {
            shape: client.get(f"/v1/runs/{ids[shape]}/messages").json()["messages"]
            for shape in SHAPES
        }
        assert llm.violations == [], llm.violations  # no request had a dangling tool call
    print(f"{len(SHAPES)} shapes, {len(llm.requests)} model requests, no refusal")
    for shape in SHAPES:
        run, msgs = final[shape], transcripts[shape]
        assert run["status"] == "completed", (shape, run["status"], run.get("error"))
        asked = [c["id"] for m in msgs for c in m.get("tool_calls") or []]
        answered = Counter(m["tool_call_id"] for m in msgs if m["role"] == "tool")
        assert sorted(answered) == sorted(asked), shape
        assert set(answered.values()) <= {1}, shape
        stop = "S" in shape.split() and not _ask_first(shape)
        assert run["stop_reason"] == ("stop_tool" if stop else "completed"), shape
