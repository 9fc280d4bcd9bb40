"""Flower starts against the Redis broker and lists the workers and recent
tasks."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from scheduler.app import create_app
from shared.engine.runtime import Runtime
from tests.support import ROOT, WorkerProcs, wait_for

AUTH = ("ops", "s3cret")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def flower(workers: WorkerProcs, tmp_path: Path) -> Iterator[str]:
    port = _port()
    env = {**os.environ, **workers.env, "TREADLE_FLOWER_AUTH": ":".join(AUTH)}
    log = open(tmp_path / "flower.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "scheduler.cli", "flower", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(f"{url}/api/workers", auth=AUTH, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(up, 30, what="flower")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


def test_flower_lists_workers_and_recent_tasks(
    prod_rt: Runtime, workers: WorkerProcs, flower: str
) -> None:
    workers.env["TREADLE_TASK_EVENTS"] = "true"  # as a deployment that runs Flower sets it
    workers.start("alpha")
    assert httpx.get(f"{flower}/api/workers", timeout=5).status_code == 401  # auth is on
    chat = {"kind": "chat", "model": {"provider": "scripted", "replies": [{"text": "hi"}]}}
    with TestClient(create_app(lambda: prod_rt)) as client:
        run = client.post("/v1/runs", json={"agent": chat, "input": "hello"}).json()
        wait_for(lambda: client.get(f"/v1/runs/{run['id']}").json()["status"] == "completed", 30)

    def workers_listed() -> bool:
        names = httpx.get(f"{flower}/api/workers?refresh=1", auth=AUTH, timeout=10).json()
        return any(n.startswith("alpha@") for n in names)

    def task_listed() -> dict:  # type: ignore[type-arg]
        tasks = httpx.get(f"{flower}/api/tasks", auth=AUTH, timeout=5).json()
        return {k: t for k, t in tasks.items() if t.get("name") == "treadle.round"}

    wait_for(workers_listed, 30, interval=1, what="flower to list the worker")
    tasks = wait_for(task_listed, 30, interval=0.25, what="flower to list the round task")
    assert any(run["id"] in str(t.get("args")) for t in tasks.values())
