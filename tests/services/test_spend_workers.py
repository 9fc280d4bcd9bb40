"""Money through real Celery workers on PostgreSQL + Redis (docs/cost.md):

- 20 runs of one tenant share a tenant envelope across two workers: what is spent never
  passes the cap, the runs that cannot be afforded wait (``pending.kind: budget``), and they
  go on when the cap is raised over the API;
- a worker SIGKILLed in the middle of a failed-over round: the round is taken over and served
  by the same fallback; its call is billed once, plus the abandoned one, marked so
  (``committed: false``, estimated).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from scheduler.app import create_app
from scheduler.embedded import ReaperLoop
from shared.engine.runtime import Runtime
from shared.llm.fake_server import FakeLLMServer, ReplySpec
from shared.llm.profiles import load_profiles
from shared.store.tables import usage
from tests.support import RoundsModel, WorkerProcs, requests_per_round, wait_for

PRICED = {"tiers": [{"input": 0.1, "output": 0.1}]}
WORDS = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor "


@pytest.fixture
def fast_recovery(tmp_path: Path) -> dict[str, str]:
    return {"TREADLE_LEASE_SECONDS": "3", "TREADLE_REAPER_INTERVAL": "0.5"}


@pytest.fixture
def reaper(prod_rt: Runtime) -> Iterator[ReaperLoop]:
    loop = ReaperLoop(prod_rt, 0.5).start()
    yield loop
    loop.stop()


def _spender(i: int) -> dict[str, Any]:
    replies: list[dict[str, Any]] = [
        {
            "text": WORDS * 4,
            "tool_calls": [{"id": f"e{k}", "name": "echo", "arguments": {"text": "x"}}],
        }
        for k in range(3)
    ]
    replies.append({"text": f"run {i} done"})
    model = {"provider": "scripted", "replies": replies, "pricing": PRICED, "max_tokens": 200}
    return {"kind": "agent", "tools": ["echo"], "model": model}


def _status(client: TestClient, run_id: str) -> str:
    return str(client.get(f"/v1/runs/{run_id}").json()["status"])


def _spent(client: TestClient) -> dict[str, Any]:
    (envelope,) = client.get("/v1/spend").json()["envelopes"]
    return dict(envelope)


def test_runs_sharing_a_tenant_envelope_never_pass_it(
    prod_rt: Runtime, workers: WorkerProcs, reaper: ReaperLoop
) -> None:
    workers.start_many(["alpha", "beta"], concurrency=4)
    cap = 0.2
    with TestClient(create_app(lambda: prod_rt)) as client:
        put = client.put("/v1/spend/tenant", json={"cap": cap, "period": "day"})
        assert put.status_code == 200, put.text
        ids = [
            client.post("/v1/runs", json={"agent": _spender(i), "input": "go"}).json()["id"]
            for i in range(20)
        ]
        highest = 0.0

        def settled() -> bool:
            nonlocal highest
            envelope = _spent(client)
            highest = max(highest, envelope["spent"] + envelope["reserved"])
            states = [_status(client, r) for r in ids]
            return all(s in ("completed", "waiting") for s in states) and "waiting" in states

        wait_for(settled, 120, interval=0.2, what="every run completed or waiting")
        envelope = _spent(client)
        assert highest <= cap + 1e-9 and envelope["spent"] <= cap + 1e-9
        waiting = [r for r in ids if _status(client, r) == "waiting"]
        pending = client.get(f"/v1/runs/{waiting[0]}").json()["pending"]
        assert pending["kind"] == "budget" and pending["scope"] == "tenant"
        assert client.put("/v1/spend/tenant", json={"cap": 100.0, "period": "day"}).is_success
        wait_for(
            lambda: all(_status(client, r) == "completed" for r in ids), 120, what="all resumed"
        )
        with prod_rt.engine.connect() as conn:
            billed = conn.execute(sa.select(sa.func.sum(usage.c.cost))).scalar_one()
        assert _spent(client)["spent"] == pytest.approx(float(billed))
        metrics = client.get("/metrics").text
        assert 'treadle_spend{kind="spent",scope="tenant"}' in metrics


def test_a_worker_killed_in_a_failed_over_round_bills_that_call_once(
    prod_rt: Runtime, workers: WorkerProcs, tmp_path: Path
) -> None:
    slow_once = {"n": 0}

    with FakeLLMServer() as backup:
        rounds = RoundsModel(3)

        def responder(body: dict[str, Any]) -> Any:
            spec = rounds(body)
            k = 1 + sum(1 for m in body["messages"] if m["role"] == "assistant")
            if k == 2 and slow_once["n"] == 0:  # the first try of round 2 hangs: killed
                slow_once["n"] += 1
                return ReplySpec(text="", first_byte_latency=30.0)
            return spec

        backup.responder = responder
        profiles = tmp_path / "profiles.json"
        primary = {
            "provider": "openai",
            "base_url": "http://127.0.0.1:9/v1",
            "model": "m",
            "max_retries": 0,
            "timeout_connect": 1.0,
            "fallback": ["backup"],
        }
        second = {"provider": "openai", "base_url": backup.base_url, "model": "b"}
        profiles.write_text(json.dumps({"profiles": {"primary": primary, "backup": second}}))
        env = {"TREADLE_PROFILES_FILE": str(profiles), "TREADLE_ALLOW_HOSTS": "127.0.0.1"}
        agent = {"kind": "agent", "model": "primary", "tools": ["echo"], "max_rounds": 10}
        rt = replace(prod_rt, profiles=load_profiles(profiles))
        with TestClient(create_app(lambda: rt)) as client:
            workers.start("alpha", env=env)
            run_id = client.post("/v1/runs", json={"agent": agent, "input": "go"}).json()["id"]
            wait_for(lambda: slow_once["n"] == 1, 60, what="the failed-over round in flight")
            time.sleep(0.5)
            workers.kill("alpha")
            workers.start("beta", env=env)
            reaper = ReaperLoop(rt, 0.5).start()
            try:
                wait_for(lambda: _status(client, run_id) == "completed", 90, what="completed")
            finally:
                reaper.stop()
        with prod_rt.engine.connect() as conn:
            rows = conn.execute(
                sa.select(usage.c.round, usage.c.profile, usage.c.committed, usage.c.estimated)
                .where(usage.c.run_id == run_id)
                .order_by(usage.c.id)
            ).all()
        per_round = requests_per_round(backup)
    abandoned = [r for r in rows if not r.committed]
    assert [(r.round, r.profile, r.estimated) for r in abandoned] == [(2, "backup", True)]
    committed = [(r.round, r.profile) for r in rows if r.committed]
    assert committed == [(1, "backup"), (2, "backup"), (3, "backup")]
    assert per_round[2] == 2  # the abandoned call and the one that committed
