"""Flower starts against the Redis broker and lists the workers and recent tasks; with the
defaults, every round of a run is its own ``treadle.round`` task there."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from scheduler.app import create_app
from shared.engine.runtime import Runtime
from shared.llm.fake_server import FakeLLMServer, ReplySpec
from tests.loopback import LoopbackServer
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


class _Echo(BaseHTTPRequestHandler):
    """A read-only HTTP tool's endpoint: the JSON body back."""

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def echo_endpoint() -> Iterator[str]:
    server = LoopbackServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/echo"
    finally:
        server.shutdown()
        server.server_close()


def _eight_tool_calls_then_answer(body: dict[str, Any]) -> ReplySpec:
    n = sum(1 for m in body.get("messages") or () if m.get("role") == "assistant")
    if n >= 8:
        return ReplySpec(text="done")
    return ReplySpec(tool_calls=[{"id": f"c{n}", "name": "echo", "arguments": {"text": str(n)}}])


@pytest.mark.parametrize("reads_in_round", [False, True], ids=["defaults", "reads-in-round"])
def test_every_round_of_an_http_tool_run_is_a_round_task_in_flower(
    prod_rt: Runtime, workers: WorkerProcs, flower: str, echo_endpoint: str, reads_in_round: bool
) -> None:
    """Defaults (no in-place driving): a 9-round run with an inline HTTP tool is 9 succeeded
    ``treadle.round`` tasks with its run id in their args, in Flower's own API, and each read
    is a ``treadle.tool`` task. Reads run in the round (opt-in): the same 9 round tasks, and
    no tool task (what the opt-in trades)."""
    workers.env.update(TREADLE_TASK_EVENTS="true", TREADLE_ALLOW_HOSTS="127.0.0.1")
    if reads_in_round:
        workers.env["TREADLE_WORKER_READ_TOOLS_IN_ROUND"] = "true"
    workers.start("rounds")
    rt = replace(prod_rt, settings=prod_rt.settings.model_copy(update={"allow_hosts": "127.0.0.1"}))
    with FakeLLMServer(_eight_tool_calls_then_answer) as llm:
        agent = {
            "kind": "agent",
            "model": {"provider": "openai", "base_url": llm.base_url, "model": "fake"},
            "tools": [
                {
                    "name": "echo",
                    "read_only": True,
                    "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
                    "http": {"method": "POST", "url": echo_endpoint},
                }
            ],
        }
        with TestClient(create_app(lambda: rt)) as client:
            run = client.post("/v1/runs", json={"agent": agent, "input": "go"}).json()
            run_id = run["id"]
            wait_for(lambda: client.get(f"/v1/runs/{run_id}").json()["status"] == "completed", 30)
        assert len(llm.requests) == 9

    def of_the_run(name: str) -> list[dict[str, Any]]:
        tasks = httpx.get(f"{flower}/api/tasks", auth=AUTH, timeout=5).json()
        mine = [t for t in tasks.values() if t.get("name") == name and run_id in str(t.get("args"))]
        return [t for t in mine if t.get("state") == "SUCCESS"]

    def rounds_of_the_run() -> list[dict[str, Any]]:
        done = of_the_run("treadle.round")
        return done if len(done) >= 9 else []

    succeeded = wait_for(rounds_of_the_run, 20, interval=0.5, what="9 round tasks in flower")
    assert len(succeeded) == 9
    tools = 0 if reads_in_round else 8
    wait_for(lambda: len(of_the_run("treadle.tool")) >= tools, 20, what="the tool tasks")
    assert len(of_the_run("treadle.tool")) == tools
