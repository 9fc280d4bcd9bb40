"""Threads through real Celery workers on Redis + PostgreSQL: history across
runs, one active run per thread, and the multitask policies under concurrent submits (the
thread row lock serializes admission and release; lock order thread → runs, no deadlock)."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastapi.testclient import TestClient

from scheduler.app import create_app
from shared.agent.spec import AgentSpec
from shared.engine import commands, threads
from shared.engine.runtime import Runtime
from shared.errors import Conflict
from shared.store import records
from shared.store import threads as thread_store
from tests.support import WorkerProcs, wait_for

CATEGORIES = [
    {"key": "weather", "description": "questions about weather"},
    {"key": "other", "description": "anything else"},
]
FINAL = {"completed", "failed", "cancelled"}


def _scripted(*texts: str, sleep: float = 0.0) -> dict[str, Any]:
    return {"provider": "scripted", "replies": [{"text": t, "sleep": sleep} for t in texts]}


def _finish(client: TestClient, run_id: str, timeout: float = 30) -> dict[str, Any]:
    done: dict[str, Any] = wait_for(
        lambda: (r := client.get(f"/v1/runs/{run_id}").json())["status"] in FINAL and r,
        timeout,
        what=f"run {run_id} to finish",
    )
    return done


def test_a_thread_of_runs_through_real_workers(prod_rt: Runtime, workers: WorkerProcs) -> None:
    # enqueue (default): five runs submitted at once start one at a time, in order, each with
    # the previous turns as history; a classify run on the thread sees the last classify result
    workers.start_many(["alpha", "beta"])
    chat = {"kind": "chat", "model": _scripted("answer")}
    with TestClient(create_app(lambda: prod_rt)) as client:
        tid = client.post("/v1/threads", json={}).json()["id"]
        ids = [
            client.post(
                "/v1/runs", json={"agent": chat, "input": f"q{i}", "thread_id": tid}
            ).json()["id"]
            for i in range(5)
        ]
        for run_id in ids:
            assert _finish(client, run_id)["status"] == "completed"
        for i, run_id in enumerate(ids):
            msgs = client.get(f"/v1/runs/{run_id}/messages").json()["messages"]
            history = [m["content"] for m in msgs if m["kind"] == "history"]
            assert history == [x for j in range(i) for x in (f"q{j}", "answer")]
        classify = {"kind": "classify", "categories": CATEGORIES, "model": _scripted("weather")}
        for text in ("rain?", "and tomorrow?"):
            run = client.post(
                "/v1/runs", json={"agent": classify, "input": text, "thread_id": tid}
            ).json()
            assert _finish(client, run["id"])["result"]["category"] == "weather"
        thread = client.get(f"/v1/threads/{tid}").json()
    assert [r["status"] for r in thread["runs"]] == ["completed"] * 7
    assert len(thread["messages"]) == 14


def _thread_runs(rt: Runtime, tid: str) -> list[Any]:
    with rt.engine.connect() as conn:
        return thread_store.thread_runs(conn, tid)


def _all_final(rt: Runtime, tids: list[str]) -> bool:
    return all(r["status"] in FINAL for t in tids for r in _thread_runs(rt, t))


def test_concurrent_submits_keep_one_active_run_per_thread(
    prod_rt: Runtime, workers: WorkerProcs
) -> None:
    workers.start_many(["alpha", "beta"], concurrency=8)
    enqueue = [commands.new_id("thr") for _ in range(3)]
    interrupt, reject = commands.new_id("thr"), commands.new_id("thr")
    for tid in enqueue:
        threads.create_thread(prod_rt, "default", None, "enqueue", tid)
    threads.create_thread(prod_rt, "default", None, "interrupt", interrupt)
    threads.create_thread(prod_rt, "default", None, "reject", reject)
    quick = AgentSpec.model_validate({"kind": "chat", "model": _scripted("a", sleep=0.02)})
    slow = AgentSpec.model_validate({"kind": "chat", "model": _scripted("b", sleep=0.3)})
    rng = random.Random(7)
    jobs = [(rng.choice(enqueue), quick, f"q{i}") for i in range(36)]
    jobs += [(interrupt, slow, f"i{i}") for i in range(8)]
    jobs += [(reject, slow, f"r{i}") for i in range(8)]
    rng.shuffle(jobs)

    def submit(job: tuple[str, AgentSpec, str]) -> str:
        tid, spec, text = job
        try:
            row, _ = commands.submit_run(
                prod_rt, commands.RunInput(agent=spec, input=text, thread_id=tid)
            )
        except Conflict:
            return "rejected"
        if rng.random() < 0.1:  # cancel some (held or active) at once
            try:
                commands.cancel_run(prod_rt, "default", row["id"])
            except Conflict:
                pass
        return str(row["id"])

    with ThreadPoolExecutor(max_workers=12) as pool:
        outcomes = list(pool.map(submit, jobs))
    tids = [*enqueue, interrupt, reject]
    wait_for(lambda: _all_final(prod_rt, tids), 90, what="every run on the threads to end")
    assert outcomes.count("rejected") >= 1  # reject: refused while its thread was busy
    for tid in enqueue:
        _check_sequential(prod_rt, _thread_runs(prod_rt, tid))
    last = _thread_runs(prod_rt, interrupt)[-1]
    assert last["status"] in ("completed", "cancelled")  # the last one was never interrupted
    for log in ("alpha", "beta"):
        assert "deadlock" not in workers.log(log).lower()


def _check_sequential(rt: Runtime, runs: list[Any]) -> None:
    """Each started run saw exactly the runs that started before it, in order: they ran one
    at a time, in admission order."""
    seen: list[str] = []
    with rt.engine.connect() as conn:
        for run in runs:
            msgs = records.list_messages(conn, run["id"])
            if run["held"]:  # cancelled before it started
                assert run["status"] == "cancelled" and msgs == []
                continue
            history = [m["content"] for m in msgs if m["kind"] == "history" and m["role"] == "user"]
            assert history == seen, (run["id"], history, seen)
            seen += [m["content"] for m in msgs if m["kind"] is None and m["role"] == "user"]
