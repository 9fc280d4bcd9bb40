"""The tool agent through real Celery workers on Redis + PostgreSQL."""

from __future__ import annotations

from fastapi.testclient import TestClient

from scheduler.app import create_app
from shared.engine.runtime import Runtime
from shared.isotime import epoch
from tests.support import WorkerProcs, wait_for

TOOLS = ["echo", "boom", "sleepy"]


def _call(name: str, args: object, id: str) -> dict[str, object]:
    return {"id": id, "name": name, "arguments": args}


def _agent(replies: list[dict[str, object]], **kw: object) -> dict[str, object]:
    return {
        "kind": "agent",
        "model": {"provider": "scripted", "replies": replies},
        "tools": TOOLS,
        **kw,
    }


def _finish(client: TestClient, run_id: str, timeout: float = 30) -> dict[str, object]:
    return wait_for(
        lambda: (
            (r := client.get(f"/v1/runs/{run_id}").json())["status"] in ("completed", "failed")
            and r
        ),
        timeout,
        what=f"run {run_id} to finish",
    )


def test_four_round_run_through_real_workers(prod_rt: Runtime, workers: WorkerProcs) -> None:
    # SPEC L-4, L-5: calls ordered as made; errors are tool results
    workers.start("alpha")
    workers.start("beta")
    agent = _agent(
        [
            {"tool_calls": [_call("echo", {"text": t}, f"c{t}") for t in "abc"]},
            {"tool_calls": [_call("boom", {}, "c4")]},
            {"tool_calls": [_call("nope", {}, "c5"), _call("echo", '{"text": ', "c6")]},
            {"text": "All done."},
        ],
        parallel_tools=3,
    )
    with TestClient(create_app(lambda: prod_rt)) as client:
        run = client.post("/v1/runs", json={"agent": agent, "input": "go"}).json()
        done = _finish(client, run["id"])
        msgs = client.get(f"/v1/runs/{run['id']}/messages").json()["messages"]
    assert done["status"] == "completed" and done["result"]["text"] == "All done."
    tools = [(m["tool_call_id"], m["content"]) for m in msgs if m["role"] == "tool"]
    assert tools[:3] == [("ca", "a"), ("cb", "b"), ("cc", "c")]
    assert tools[3] == ("c4", "Tool error: the flux capacitor is cold")
    assert tools[4] == ("c5", "Tool not found: nope")
    assert tools[5][0] == "c6" and tools[5][1].startswith("Invalid arguments for echo: ")
    assert [m["role"] for m in msgs][-1] == "assistant"


def _batch_wall(client: TestClient, parallel: int) -> float:
    agent = _agent(
        [
            {
                "tool_calls": [
                    _call("sleepy", {"seconds": 1, "label": str(i)}, f"s{i}") for i in range(3)
                ]
            },
            {"text": "ok"},
        ],
        parallel_tools=parallel,
    )
    run = client.post("/v1/runs", json={"agent": agent, "input": "go"}).json()
    _finish(client, run["id"])
    calls = client.get(f"/v1/runs/{run['id']}/tool-calls").json()["tool_calls"]
    return max(epoch(c["finished_at"]) for c in calls) - min(epoch(c["started_at"]) for c in calls)


def test_parallel_batch_runs_concurrently_serial_does_not(
    prod_rt: Runtime, workers: WorkerProcs
) -> None:
    # SPEC L-4: parallel_tools=3 → the three 1 s tools overlap; parallel_tools=1 → one by one
    workers.start("alpha", concurrency=2)
    workers.start("beta", concurrency=2)
    with TestClient(create_app(lambda: prod_rt)) as client:
        parallel = _batch_wall(client, 3)
        serial = _batch_wall(client, 1)
    assert parallel < 2.0, f"parallel batch took {parallel:.2f}s"
    assert serial >= 3.0, f"serial batch took {serial:.2f}s"
