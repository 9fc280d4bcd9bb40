"""Sub-agents and knowledge through real Celery workers on Redis + PostgreSQL:
children of one reply run concurrently; a child's question pauses the whole chain holding
nothing; a chat run quotes a dataset."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
import sqlalchemy as sa
from fastapi.testclient import TestClient

from scheduler.app import create_app
from shared.engine.children import child_run_id
from shared.engine.runtime import Runtime
from shared.llm.fake_server import FakeLLMServer
from shared.priorities import queue_keys
from shared.store import records
from shared.store.tables import outbox, usage
from tests.support import WorkerProcs, wait_for

PRICING = {"tiers": [{"input": 1.0, "output": 1.0}]}


def _scripted(*replies: dict[str, Any]) -> dict[str, Any]:
    return {"provider": "scripted", "replies": list(replies), "pricing": PRICING}


def _call(name: str, args: object, id: str) -> dict[str, object]:
    return {"id": id, "name": name, "arguments": args}


def _tool(name: str, child: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "description": f"Delegate to {name}.", "agent": child, "read_only": True}


def _status(client: TestClient, run_id: str, *wanted: str, timeout: float = 40) -> Any:
    return wait_for(
        lambda: (r := client.get(f"/v1/runs/{run_id}").json())["status"] in wanted and r,
        timeout,
        what=f"run {run_id} to be {'/'.join(wanted)}",
    )


def _interval(rt: Runtime, run_id: str) -> tuple[float, float]:
    """From the child's first round start to its completion (durable event times)."""
    with rt.engine.connect() as conn:
        events = records.list_events(conn, run_id)
    start = min(e["created_at"] for e in events if e["type"] == "round.started")
    end = max(e["created_at"] for e in events if e["type"] == "run.completed")
    return start, end


def _queued(rt: Runtime) -> int:
    """Messages in the broker: queued, or delivered and not yet acknowledged."""
    r = redis.Redis.from_url(rt.settings.broker_url)
    p = rt.settings.broker_prefix
    return sum(
        int(r.llen(f"{p}{k}")) for q in ("treadle.rounds", "treadle.tools") for k in queue_keys(q)
    ) + int(r.hlen(f"{p}unacked"))


def _outbox(rt: Runtime, *run_ids: str) -> int:
    with rt.engine.connect() as conn:
        return int(
            conn.execute(
                sa.select(sa.func.count()).select_from(outbox).where(outbox.c.run_id.in_(run_ids))
            ).scalar_one()
        )


def test_two_sub_agents_run_concurrently_and_join_in_call_order(
    prod_rt: Runtime, workers: WorkerProcs
) -> None:
    workers.start("alpha", concurrency=4)
    workers.start("beta", concurrency=4)
    alpha = {"kind": "agent", "model": _scripted({"text": "Alpha: 42.", "sleep": 1.5})}
    beta = {"kind": "agent", "model": _scripted({"text": "Beta: 7.", "sleep": 1.5})}
    parent = {
        "kind": "agent",
        "parallel_tools": 2,
        "model": _scripted(
            {
                "tool_calls": [
                    _call("alpha", {"input": "A?"}, "c1"),
                    _call("beta", {"input": "B?"}, "c2"),
                ]
            },
            {"text": "Both answered."},
        ),
        "tools": [_tool("alpha", alpha), _tool("beta", beta)],
    }
    with TestClient(create_app(lambda: prod_rt)) as client:
        run = client.post("/v1/runs", json={"agent": parent, "input": "ask both"}).json()
        done = _status(client, run["id"], "completed", "failed")
        calls = client.get(f"/v1/runs/{run['id']}/tool-calls").json()["tool_calls"]
        msgs = client.get(f"/v1/runs/{run['id']}/messages").json()["messages"]
        kids = [
            client.get(f"/v1/runs/{child_run_id(run['id'], c['call_id'])}").json() for c in calls
        ]
    assert done["status"] == "completed" and done["result"]["text"] == "Both answered."
    assert [m["content"] for m in msgs if m["role"] == "tool"] == ["Alpha: 42.", "Beta: 7."]
    (a0, a1), (b0, b1) = (_interval(prod_rt, k["id"]) for k in kids)
    assert max(a0, b0) < min(a1, b1), "the two children's rounds must overlap"
    assert [c["cost"] for c in calls] == [k["usage"]["cost"] for k in kids]
    assert done["usage"]["cost"] > sum(k["usage"]["cost"] for k in kids) > 0  # rolled up


def test_a_childs_question_pauses_the_chain_holding_nothing(
    prod_rt: Runtime, workers: WorkerProcs
) -> None:
    workers.start("alpha")
    child = {
        "kind": "agent",
        "ask": True,
        "model": _scripted(
            {
                "tool_calls": [
                    _call(
                        "ask_user",
                        {"question": "Which city?", "options": ["Paris", "Rome"]},
                        "ask1",
                    )
                ]
            },
            {"text": "Booked Rome."},
        ),
    }
    parent = {
        "kind": "agent",
        "model": _scripted(
            {"tool_calls": [_call("booker", {"input": "book"}, "c1")]}, {"text": "Trip ready."}
        ),
        "tools": [_tool("booker", child)],
    }
    with TestClient(create_app(lambda: prod_rt)) as client:
        run = client.post("/v1/runs", json={"agent": parent, "input": "trip"}).json()
        waiting = _status(client, run["id"], "waiting")
        pending = waiting["pending"]
        child_id = pending["run_id"]
        assert (pending["kind"], pending["ask_id"]) == ("ask", "ask1")
        assert pending["questions"][0]["question"] == "Which city?"
        assert client.get(f"/v1/runs/{child_id}").json()["status"] == "waiting"
        time.sleep(1.0)
        assert _outbox(prod_rt, run["id"], child_id) == 0, "no outbox row while waiting"
        assert _queued(prod_rt) == 0, "no broker message while waiting"
        r = client.post(
            f"/v1/runs/{run['id']}/answer", json={"ask_id": "ask1", "answers": ["Rome"]}
        )
        assert r.status_code == 200 and r.json()["status"] == "running"
        done = _status(client, run["id"], "completed", "failed")
        kid = client.get(f"/v1/runs/{child_id}").json()
    assert done["status"] == "completed" and done["result"]["text"] == "Trip ready."
    assert kid["status"] == "completed" and kid["parent_run_id"] == run["id"]


def test_a_chat_run_quotes_a_dataset_through_workers(
    prod_rt: Runtime, workers: WorkerProcs
) -> None:
    workers.start("alpha")
    with FakeLLMServer() as llm, TestClient(create_app(lambda: prod_rt)) as client:
        assert client.post("/v1/datasets", json={"name": "manual"}).status_code == 201
        r = client.post(
            "/v1/datasets/manual/documents",
            json={
                "name": "manual.md",
                "text": "# Care\n\nDescale the kettle every month with vinegar.\n\n"
                "# Warranty\n\nThe warranty covers two years.",
            },
        )
        assert r.status_code == 201, r.text
        hits = client.get("/v1/datasets/manual/search", params={"q": "descale kettle"}).json()
        assert "vinegar" in hits["results"][0]["text"]
        agent = {
            "kind": "chat",
            "dataset": "manual",
            "model": {"provider": "openai", "base_url": llm.base_url, "model": "m"},
        }
        run = client.post("/v1/runs", json={"agent": agent, "input": "How to descale?"}).json()
        done = _status(client, run["id"], "completed", "failed")
        system = llm.bodies[0]["messages"][0]["content"]
    assert done["status"] == "completed"
    assert "Descale the kettle every month with vinegar." in system
    assert "Source: manual.md" in system


def test_three_parallel_children_keep_the_parents_max_cost(
    prod_rt: Runtime, workers: WorkerProcs
) -> None:
    # each child gets what the parent has left, reserved when it starts: three children that
    # each try to spend 0.01 (the parent's whole max_cost), running at once on two workers,
    # never take the parent past 0.01 by more than one model call (the one that crosses it)
    workers.start("alpha", concurrency=4)
    workers.start("beta", concurrency=4)
    cheap = {"tiers": [{"input": 0.01, "output": 0.01}]}  # the first call's worst case fits
    echo = [_call("echo", {"text": "x" * 80}, f"s{i}") for i in range(40)]
    spender = {
        "kind": "agent",
        "tools": ["echo"],
        "max_rounds": 40,
        "force_answer_after": 100,
        "budget": {"max_cost": 0.01},  # each child alone would spend the parent's whole budget
        "model": {
            "provider": "scripted",
            "replies": [{"tool_calls": [c], "sleep": 0.05} for c in echo],
            "pricing": cheap,
        },
    }
    parent = {
        "kind": "agent",
        "parallel_tools": 3,
        "budget": {"max_cost": 0.01},
        "model": {
            "provider": "scripted",
            "replies": [
                {
                    "tool_calls": [
                        _call("a", {"input": "spend"}, "c1"),
                        _call("b", {"input": "spend"}, "c2"),
                        _call("c", {"input": "spend"}, "c3"),
                    ]
                },
                {"text": "done"},
            ],
            "pricing": cheap,
        },
        "tools": [_tool("a", spender), _tool("b", spender), _tool("c", spender)],
    }
    with TestClient(create_app(lambda: prod_rt)) as client:
        run = client.post("/v1/runs", json={"agent": parent, "input": "go"}).json()
        assert "id" in run, run
        done = _status(client, run["id"], "completed", "failed", timeout=90)
        kids = [
            client.get(f"/v1/runs/{child_run_id(run['id'], c)}").json() for c in ["c1", "c2", "c3"]
        ]
    with prod_rt.engine.connect() as conn:
        ids = [run["id"], *[k["id"] for k in kids]]
        rows = conn.execute(
            sa.select(usage.c.cost).where(usage.c.run_id.in_(ids), usage.c.committed)
        ).all()
        costs = [float(c) for (c,) in rows]
    total, one_call = sum(costs), max(costs)
    print(f"3 children, parent max_cost 0.01: total {total:.6f}, one call {one_call:.6f}")
    assert done["usage"]["cost"] == pytest.approx(total)
    assert total <= 0.01 + 1e-9, (total, one_call)  # reservations: never above the cap
    assert sum(1 for k in kids if k["stop_reason"] == "budget_cost") >= 2, kids
    assert len(costs) > 4  # the children did spend: the budget, not a bug, stopped them
