"""Threads over HTTP on SQLite with the stub broker."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker


def _chat(*texts: str) -> dict[str, Any]:
    return {
        "kind": "chat",
        "model": {"provider": "scripted", "replies": [{"text": t} for t in texts]},
    }


def _thread(client: TestClient, **body: Any) -> dict[str, Any]:
    r = client.post("/v1/threads", json=body)
    assert r.status_code == 201, r.text
    return dict(r.json())


def _run(client: TestClient, thread_id: str, text: str, *replies: str) -> Any:
    return client.post(
        "/v1/runs",
        json={"agent": _chat(*(replies or ("ok",))), "input": text, "thread_id": thread_id},
    )


def test_create_and_get_a_thread(client: TestClient) -> None:
    thread = _thread(client, metadata={"user": "u1"})
    assert thread["id"].startswith("thr_") and thread["multitask"] == "enqueue"
    assert thread["metadata"] == {"user": "u1"}
    got = client.get(f"/v1/threads/{thread['id']}").json()
    assert got["runs"] == [] and got["messages"] == [] and got["multitask"] == "enqueue"
    assert client.post("/v1/threads").json()["metadata"] is None  # no body at all


def test_thread_errors(client: TestClient) -> None:
    r = client.get("/v1/threads/thr_nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = client.post("/v1/threads", json={"multitask": "queue"})
    assert r.status_code == 422
    r = client.post("/v1/threads", json={"bogus": 1})
    assert r.status_code == 422
    r = _run(client, "thr_nope", "hello")
    assert r.status_code == 404 and "thread" in r.json()["error"]["message"]


def test_thread_runs_and_messages_across_runs(
    client: TestClient, sqlite_rt: Runtime, stub: StubBroker
) -> None:
    tid = _thread(client)["id"]
    first = _run(client, tid, "capital of France?", "Paris.").json()
    second = _run(client, tid, "and of Italy?", "Rome.").json()
    assert second["status"] == "queued" and second["thread_id"] == tid
    stub.drain(sqlite_rt)
    got = client.get(f"/v1/threads/{tid}").json()
    assert got["runs"] == [
        {"id": first["id"], "status": "completed", "kind": "chat"},
        {"id": second["id"], "status": "completed", "kind": "chat"},
    ]
    # each run's own messages once (the history copies are not repeated)
    assert [(m["run_id"], m["role"], m["content"]) for m in got["messages"]] == [
        (first["id"], "user", "capital of France?"),
        (first["id"], "assistant", "Paris."),
        (second["id"], "user", "and of Italy?"),
        (second["id"], "assistant", "Rome."),
    ]
    # the second run's own transcript starts with the thread's history
    msgs = client.get(f"/v1/runs/{second['id']}/messages").json()["messages"]
    assert [(m["content"], m["kind"]) for m in msgs] == [
        ("capital of France?", "history"),
        ("Paris.", "history"),
        ("and of Italy?", None),
        ("Rome.", None),
    ]
    listed = client.get("/v1/runs", params={"thread_id": tid}).json()["runs"]
    assert {r["id"] for r in listed} == {first["id"], second["id"]}


def test_reject_is_409_while_busy(client: TestClient, sqlite_rt: Runtime, stub: StubBroker) -> None:
    tid = _thread(client, multitask="reject")["id"]
    assert _run(client, tid, "one").status_code == 201
    r = _run(client, tid, "two")
    assert r.status_code == 409 and r.json()["error"]["code"] == "conflict"
    stub.drain(sqlite_rt)
    assert _run(client, tid, "three").status_code == 201


def test_interrupt_cancels_the_active_run(
    client: TestClient, sqlite_rt: Runtime, stub: StubBroker
) -> None:
    tid = _thread(client, multitask="interrupt")["id"]
    first = _run(client, tid, "one", "a1").json()
    second = _run(client, tid, "two", "a2").json()
    assert client.get(f"/v1/runs/{first['id']}").json()["status"] == "cancelled"
    stub.drain(sqlite_rt)
    got = client.get(f"/v1/runs/{second['id']}").json()
    assert got["status"] == "completed" and got["result"] == {"text": "a2"}


def test_an_agent_tool_may_name_a_registered_agent(
    client: TestClient, sqlite_rt: Runtime, stub: StubBroker
) -> None:
    # the API resolves the name: the run stores a self-contained spec
    agent = {
        "kind": "agent",
        "model": {
            "provider": "scripted",
            "replies": [
                {"tool_calls": [{"id": "c1", "name": "helper", "arguments": {"input": "Hi"}}]},
                {"text": "Done."},
            ],
        },
        "tools": [{"name": "helper", "description": "A chat agent.", "agent": "demo-chat"}],
    }
    run = client.post("/v1/runs", json={"agent": agent, "input": "go"}).json()
    assert run["agent"]["tools"][0]["agent"]["kind"] == "chat"
    stub.drain(sqlite_rt)
    assert client.get(f"/v1/runs/{run['id']}").json()["status"] == "completed"
    calls = client.get(f"/v1/runs/{run['id']}/tool-calls").json()["tool_calls"]
    assert calls[0]["result"].startswith("Hello! You asked: Hi")
    r = client.post(
        "/v1/runs",
        json={
            "agent": {**agent, "tools": [{"name": "x", "agent": "no-such-agent"}]},
            "input": "go",
        },
    )
    assert r.status_code == 404
    r = client.post(
        "/v1/runs",
        json={"agent": {**agent, "tools": [{"name": "x", "agent": "demo"}]}, "input": "go"},
    )
    # a registered tool agent is a sub-agent: it runs as a child run
    assert r.status_code == 201 and r.json()["agent"]["tools"][0]["agent"]["kind"] == "agent"
