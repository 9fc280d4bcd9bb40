"""Resume, fork, steer and provider outages through real Celery workers on PostgreSQL + Redis,
the API in this process, the reaper as beat would run it. Model requests are counted at the
fake server (strict: a dangling tool call is a 400 there)."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa
from fastapi.testclient import TestClient

from scheduler.app import create_app
from scheduler.embedded import ReaperLoop
from shared.agent.spec import ModelProfile
from shared.engine.runtime import Runtime
from shared.llm.fake_server import FakeLLMServer
from shared.priorities import queue_keys
from shared.store.tables import messages
from tests.support import RoundsModel, WorkerProcs, requests_per_round, wait_for

FINAL = ("completed", "failed", "cancelled")


@pytest.fixture
def fast_recovery() -> dict[str, str]:
    """Outage retries a second apart; a profiles file for the workers (written per test)."""
    return {"TREADLE_PROVIDER_RETRY_S": "1", "TREADLE_REAPER_INTERVAL": "0.5"}


@pytest.fixture
def reaper(prod_rt: Runtime) -> Iterator[ReaperLoop]:
    loop = ReaperLoop(prod_rt, 0.5).start()
    yield loop
    loop.stop()


def _profile(llm: FakeLLMServer, **extra: Any) -> dict[str, Any]:
    return {"provider": "openai", "base_url": llm.base_url, "model": "m", "max_retries": 1, **extra}


def _agent(model: Any, **spec: Any) -> dict[str, Any]:
    return {"kind": "agent", "tools": ["echo"], "max_rounds": 100, "model": model, **spec}


def _status(client: TestClient, run_id: str, *wanted: str, timeout: float = 60) -> Any:
    return wait_for(
        lambda: (r := client.get(f"/v1/runs/{run_id}").json())["status"] in wanted and r,
        timeout,
        what=f"{run_id} {'/'.join(wanted)}",
    )


def _roles(client: TestClient, run_id: str) -> list[str]:
    return [m["role"] for m in client.get(f"/v1/runs/{run_id}/messages").json()["messages"]]


def _queued(rt: Runtime) -> int:
    """Messages in the broker: queued, or delivered and not yet acknowledged."""
    r = redis.Redis.from_url(rt.settings.broker_url)
    p = rt.settings.broker_prefix
    return sum(
        int(r.llen(f"{p}{k}")) for q in ("treadle.rounds", "treadle.tools") for k in queue_keys(q)
    ) + int(r.hlen(f"{p}unacked"))


def _active_tasks(rt: Runtime) -> int:
    app = rt.publish.app  # type: ignore[attr-defined]
    active = app.control.inspect(timeout=2).active() or {}
    return sum(len(v) for v in active.values())


def test_an_outage_fails_a_run_that_will_not_wait_and_resume_completes_it(
    prod_rt: Runtime, workers: WorkerProcs
) -> None:
    workers.start("alpha")
    model = RoundsModel(20)
    model.down, model.down_from = True, 8
    with FakeLLMServer(model) as llm, TestClient(create_app(lambda: prod_rt)) as client:
        agent = _agent(_profile(llm), provider_wait_s=0)
        run = client.post("/v1/runs", json={"agent": agent, "input": "twenty steps"}).json()
        failed = _status(client, run["id"], *FINAL)
        assert failed["status"] == "failed" and failed["error"]["code"] == "model_error"
        assert failed["round"] == 7
        model.down = False
        resumed = client.post(f"/v1/runs/{run['id']}/resume")
        assert resumed.status_code == 200 and resumed.json()["status"] == "queued"
        done = _status(client, run["id"], *FINAL)
        roles = _roles(client, run["id"])
        counts = requests_per_round(llm)
    assert done["status"] == "completed" and done["result"]["text"] == "done after 20 rounds"
    assert all(counts[k] == 1 for k in range(1, 8)), counts  # rounds 1-7 not asked again
    assert counts[8] == 3 and all(counts[k] == 1 for k in range(9, 21)), counts
    assert roles == ["user", *(["assistant", "tool"] * 19), "assistant"]


def test_an_outage_is_waited_out_holding_nothing(
    prod_rt: Runtime, workers: WorkerProcs, reaper: ReaperLoop
) -> None:
    workers.start("alpha")
    model = RoundsModel(12)
    model.down, model.down_from = True, 5
    with FakeLLMServer(model) as llm, TestClient(create_app(lambda: prod_rt)) as client:
        run = client.post("/v1/runs", json={"agent": _agent(_profile(llm)), "input": "go"}).json()
        waiting = _status(client, run["id"], "waiting")
        assert waiting["pending"]["kind"] == "provider" and waiting["pending"]["retry_at"]
        wait_for(lambda: waiting_again(client, run["id"]), 30, what="a re-drive that failed")
        time.sleep(0.3)
        assert _queued(prod_rt) == 0, "a run waiting for its provider holds no queue message"
        assert _active_tasks(prod_rt) == 0, "nor a worker thread"
        model.down = False
        done = _status(client, run["id"], *FINAL, timeout=60)
        counts = requests_per_round(llm)
    assert done["status"] == "completed", done["error"]
    assert all(counts[k] == 1 for k in range(1, 5)), counts
    assert counts[5] >= 3  # the request, its retry, at least one try by the reaper


def waiting_again(client: TestClient, run_id: str) -> bool:
    run = client.get(f"/v1/runs/{run_id}").json()
    return bool(run["status"] == "waiting" and (run["pending"] or {}).get("tries", 0) >= 2)


def test_resume_on_another_profile(
    prod_rt: Runtime, pg_url: str, redis_url: str, tmp_path: Path, call_log: Path
) -> None:
    primary_model, backup_model = RoundsModel(6), RoundsModel(6)
    primary_model.down, primary_model.down_from = True, 3
    with FakeLLMServer(primary_model) as primary, FakeLLMServer(backup_model) as backup:
        profiles = {"primary": _profile(primary), "backup": _profile(backup)}
        path = tmp_path / "profiles.json"
        path.write_text(json.dumps({"profiles": profiles}))
        procs = WorkerProcs(_worker_env(prod_rt, pg_url, redis_url, call_log, path), tmp_path)
        procs.start("alpha")
        named = {n: ModelProfile.model_validate({**p, "name": n}) for n, p in profiles.items()}
        rt = replace(prod_rt, profiles=named)
        try:
            with TestClient(create_app(lambda: rt)) as client:
                agent = _agent("primary", provider_wait_s=0)
                run = client.post("/v1/runs", json={"agent": agent, "input": "go"}).json()
                assert _status(client, run["id"], *FINAL)["status"] == "failed"
                body = {"agent": {"model": "backup"}}
                assert client.post(f"/v1/runs/{run['id']}/resume", json=body).status_code == 200
                done = _status(client, run["id"], *FINAL)
        finally:
            procs.stop_all()
        assert done["status"] == "completed" and done["agent"]["model"] == "backup"
        assert requests_per_round(backup) == {k: 1 for k in range(3, 7)}
        assert requests_per_round(primary) == {1: 1, 2: 1, 3: 2}


def _worker_env(
    rt: Runtime, pg_url: str, redis_url: str, call_log: Path, profiles: Path
) -> dict[str, str]:
    return {
        "TREADLE_DATABASE_URL": pg_url,
        "TREADLE_BROKER_URL": redis_url,
        "TREADLE_BROKER_PREFIX": rt.settings.broker_prefix,
        "TREADLE_MODEL_CALL_LOG": str(call_log),
        "TREADLE_PLUGINS": "tests.plugins",
        "TREADLE_PROFILES_FILE": str(profiles),
    }


def _rows(rt: Runtime, run_id: str | None = None) -> int:
    q = sa.select(sa.func.count()).select_from(messages)
    if run_id is not None:
        q = q.where(messages.c.run_id == run_id)
    with rt.engine.connect() as conn:
        return int(conn.execute(q).scalar_one())


def test_fork_at_round_3_shares_the_source_and_lives_on_its_own(
    prod_rt: Runtime, workers: WorkerProcs
) -> None:
    workers.start("alpha")
    with FakeLLMServer(RoundsModel(6)) as llm, TestClient(create_app(lambda: prod_rt)) as client:
        agent = _agent(_profile(llm))
        source = client.post("/v1/runs", json={"agent": agent, "input": "first"}).json()
        src = _status(client, source["id"], *FINAL)
        assert src["status"] == "completed" and src["round"] == 6
        source_rows = _rows(prod_rt, source["id"])
        round4 = next(
            b for b in llm.bodies if sum(m["role"] == "assistant" for m in b["messages"]) == 3
        )
        seen = len(llm.bodies)
        fork = client.post(f"/v1/runs/{source['id']}/fork", json={"round": 3, "input": "second"})
        assert fork.status_code == 201, fork.text
        forked = _status(client, fork.json()["id"], *FINAL)
        first = llm.bodies[seen]["messages"]
        # a second fork, cancelled before any worker could drive it (none is left to: a
        # worker could otherwise finish its three rounds before the cancel arrives); the
        # source and the first fork do not move
        workers.kill("alpha", signal.SIGTERM)
        other = client.post(f"/v1/runs/{source['id']}/fork", json={"round": 3}).json()
        assert client.post(f"/v1/runs/{other['id']}/cancel").json()["status"] == "cancelled"
        after = client.get(f"/v1/runs/{source['id']}").json()
        again = client.get(f"/v1/runs/{forked['id']}").json()
    assert forked["status"] == "completed" and forked["forked_from"] == {
        "run_id": source["id"],
        "round": 3,
    }
    assert first[: len(round4["messages"])] == round4["messages"]  # exactly rounds 1-3
    assert first[len(round4["messages"]) :] == [{"role": "user", "content": "second"}]
    assert _rows(prod_rt, source["id"]) == source_rows
    assert _rows(prod_rt, forked["id"]) == 1 + 2 * 2 + 1  # its own: input, 2 rounds, answer
    assert after["updated_at"] == src["updated_at"] and after["status"] == "completed"
    assert again["updated_at"] == forked["updated_at"]


def test_messages_reach_the_next_request_never_a_batch(
    prod_rt: Runtime, workers: WorkerProcs
) -> None:
    workers.start("alpha")

    def model(body: dict[str, Any]) -> Any:
        k = 1 + sum(1 for m in body["messages"] if m["role"] == "assistant")
        if k == 1:
            return {"tool_calls": [{"id": "z1", "name": "sleepy", "arguments": {"seconds": 2}}]}
        if k == 2:
            question = {"question": "Which?", "options": ["red", "blue"]}
            return {"tool_calls": [{"id": "a2", "name": "ask_user", "arguments": question}]}
        return {"text": "done"}

    with FakeLLMServer(model) as llm, TestClient(create_app(lambda: prod_rt)) as client:
        agent = {**_agent(_profile(llm)), "tools": ["sleepy"], "ask": True}
        run = client.post("/v1/runs", json={"agent": agent, "input": "go"}).json()
        wait_for(lambda: _tool_started(client, run["id"]), 30, what="the batch under way")
        said = client.post(f"/v1/runs/{run['id']}/messages", json={"content": "mid-batch"})
        assert said.status_code == 200 and said.json()["status"] == "running"
        _status(client, run["id"], "waiting")
        client.post(f"/v1/runs/{run['id']}/messages", json={"content": "while waiting"})
        client.post(f"/v1/runs/{run['id']}/answer", json={"ask_id": "a2", "answers": ["red"]})
        done = _status(client, run["id"], *FINAL)
        second, third = llm.bodies[1]["messages"], llm.bodies[2]["messages"]
    assert done["status"] == "completed"
    assert [m["role"] for m in second[-3:]] == ["assistant", "tool", "user"]
    assert second[-2]["tool_call_id"] == "z1" and second[-1]["content"] == "mid-batch"
    assert [m["role"] for m in third[-3:]] == ["assistant", "tool", "user"]
    assert third[-2]["tool_call_id"] == "a2" and third[-1]["content"] == "while waiting"


def _tool_started(client: TestClient, run_id: str) -> bool:
    calls = client.get(f"/v1/runs/{run_id}/tool-calls").json()["tool_calls"]
    return any(c["status"] == "running" for c in calls)


def test_a_50_run_thread_stores_no_copies(prod_rt: Runtime, workers: WorkerProcs) -> None:
    workers.start("alpha")
    chat = {"kind": "chat", "model": {"provider": "scripted", "replies": [{"text": "noted"}]}}
    with TestClient(create_app(lambda: prod_rt)) as client:
        thread = client.post("/v1/threads", json={}).json()["id"]
        ids = [
            client.post(
                "/v1/runs", json={"agent": chat, "input": f"turn {i}", "thread_id": thread}
            ).json()["id"]
            for i in range(50)
        ]
        wait_for(
            lambda: all(client.get(f"/v1/runs/{i}").json()["status"] == "completed" for i in ids),
            120,
            interval=0.5,
            what="50 runs",
        )
        last = client.get(f"/v1/runs/{ids[-1]}/messages").json()["messages"]
    assert _rows(prod_rt) == 100 <= 1.1 * 100  # each run's input and answer, once
    assert [m["content"] for m in last if m["role"] == "user"] == [f"turn {i}" for i in range(50)]
