"""Sub-agents through the API: registered tool agents as tools, nested pauses
answered through the parent."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from scheduler.http import agents
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker


@pytest.fixture
def agents_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "agents.json"
    monkeypatch.setenv("TREADLE_AGENTS_FILE", str(path))
    agents._registered.cache_clear()
    yield path
    agents._registered.cache_clear()


def test_registered_tool_agents_nest_and_recursion_is_bounded(
    client: TestClient, agents_file: Path
) -> None:
    scripted = {"provider": "scripted", "replies": [{"text": "ok"}]}
    agents_file.write_text(
        json.dumps(
            {
                "worker": {"kind": "agent", "model": scripted, "tools": ["echo"]},
                "lead": {
                    "kind": "agent",
                    "model": scripted,
                    "tools": [{"name": "w", "agent": "worker"}],
                },
                "loop": {
                    "kind": "agent",
                    "model": scripted,
                    "tools": [{"name": "me", "agent": "loop"}],
                },
            }
        )
    )
    r = client.post(
        "/v1/runs",
        json={
            "agent": {
                "kind": "agent",
                "model": scripted,
                "tools": [{"name": "lead", "agent": "lead"}],
            },
            "input": "go",
        },
    )
    assert r.status_code == 201, r.text
    lead = r.json()["agent"]["tools"][0]["agent"]
    assert lead["tools"][0]["agent"]["tools"] == ["echo"]  # resolved two levels down
    r = client.post("/v1/runs", json={"agent": "loop", "input": "go"})
    assert r.status_code == 422 and "nest at most" in r.json()["error"]["message"]


def test_a_childs_ask_answered_through_the_parent(
    client: TestClient, sqlite_rt: Runtime, stub: StubBroker
) -> None:
    child = {
        "kind": "agent",
        "ask": True,
        "model": {
            "provider": "scripted",
            "replies": [
                {
                    "tool_calls": [
                        {
                            "id": "q1",
                            "name": "ask_user",
                            "arguments": {"question": "Color?", "options": ["red", "blue"]},
                        }
                    ]
                },
                {"text": "Painted blue."},
            ],
        },
    }
    agent = {
        "kind": "agent",
        "model": {
            "provider": "scripted",
            "replies": [
                {"tool_calls": [{"id": "c1", "name": "painter", "arguments": {"input": "paint"}}]},
                {"text": "The painter is done."},
            ],
        },
        "tools": [{"name": "painter", "description": "Paints.", "agent": child}],
    }
    run = client.post("/v1/runs", json={"agent": agent, "input": "go"}).json()
    stub.drain(sqlite_rt)
    got = client.get(f"/v1/runs/{run['id']}").json()
    assert got["status"] == "waiting" and got["pending"]["ask_id"] == "q1"
    child_id = got["pending"]["run_id"]
    assert client.get(f"/v1/runs/{child_id}").json()["parent_run_id"] == run["id"]
    calls = client.get(f"/v1/runs/{run['id']}/tool-calls").json()["tool_calls"]
    assert calls[0]["status"] == "child"
    r = client.post(f"/v1/runs/{run['id']}/answer", json={"ask_id": "q1", "answers": ["blue"]})
    assert r.status_code == 200 and r.json()["status"] == "running"
    stub.drain(sqlite_rt)
    done = client.get(f"/v1/runs/{run['id']}").json()
    assert done["status"] == "completed" and done["result"]["text"] == "The painter is done."
    msgs = client.get(f"/v1/runs/{run['id']}/messages").json()["messages"]
    assert [m["content"] for m in msgs if m["role"] == "tool"] == ["Painted blue."]
    # cancelling a finished parent is a conflict; its child is final too
    assert client.post(f"/v1/runs/{run['id']}/cancel").status_code == 409
    assert client.get(f"/v1/runs/{child_id}").json()["status"] == "completed"
