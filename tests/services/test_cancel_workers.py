"""Cancel stops the work in flight, through real workers (PostgreSQL + Redis): the cancel's
transaction publishes a stop on the live bus, the worker holding the run's model stream or
tool request closes its connection, and the partial model call is billed as estimated.

Measured from the test process: the time of the cancel request to the time the server saw
the connection close (both servers run in this process, one clock)."""

from __future__ import annotations

import os
import select
import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from scheduler.app import create_app
from shared.engine.livebus import RedisBus
from shared.engine.runtime import Runtime
from shared.llm.fake_server import FakeLLMServer, ReplySpec
from shared.store.tables import runs, usage
from tests.loopback import LoopbackTCPServer
from tests.support import WorkerProcs, wait_for

STOP_WITHIN_S = 1.0
PRICING = {"tiers": [{"input": 1.0, "output": 2.0}]}  # $ per 1M tokens
WORDS = " ".join(f"word{i}" for i in range(20))  # 20 pieces, 0.2 s apart: a 4 s stream


class SlowHttp:
    """An HTTP endpoint that answers after ``delay`` seconds, silent until then, and notes
    when each request arrived and when its client closed the connection before the answer."""

    def __init__(self, delay: float = 10.0) -> None:
        self.arrived: list[float] = []
        self.closed: list[float] = []
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                sock: socket.socket = self.request
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = sock.recv(4096)
                    if not chunk:
                        return
                    data += chunk
                outer.arrived.append(time.time())
                end = time.monotonic() + delay
                while time.monotonic() < end:
                    ready, _, _ = select.select([sock], [], [], 0.02)
                    if ready and not sock.recv(1, socket.MSG_PEEK):
                        outer.closed.append(time.time())
                        return
                body = b"finally"
                head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                sock.sendall(head + body)

        self.server = LoopbackTCPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> SlowHttp:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def slow_http() -> Iterator[SlowHttp]:
    with SlowHttp(10.0) as server:
        yield server


@pytest.fixture
def live_rt(prod_rt: Runtime, redis_url: str) -> Runtime:
    """The production runtime with the Redis live bus, as ``treadle api`` has it (the stop
    reaches the workers over it)."""
    return Runtime(
        engine=prod_rt.engine,
        settings=prod_rt.settings,
        publish=prod_rt.publish,
        live=RedisBus(redis_url),
    )


@pytest.fixture
def fast_recovery(slow_http: SlowHttp) -> dict[str, str]:
    return {"TREADLE_ALLOW_HOSTS": "127.0.0.1"}  # the slow tool's host (workers and API)


def _cancel_at(client: TestClient, run_id: str, started: float, after: float) -> float:
    time.sleep(max(0.0, started + after - time.time()))
    at = time.time()
    out = client.post(f"/v1/runs/{run_id}/cancel")
    assert out.status_code == 200 and out.json()["status"] == "cancelled", out.text
    return at


def _usage_rows(rt: Runtime, run_id: str) -> list[dict[str, Any]]:
    with rt.engine.connect() as conn:
        rows = conn.execute(sa.select(usage).where(usage.c.run_id == run_id).order_by(usage.c.id))
        return [dict(r) for r in rows.mappings()]


def test_cancel_closes_a_streaming_model_call_and_bills_it(
    live_rt: Runtime, workers: WorkerProcs
) -> None:
    workers.start("alpha")
    with FakeLLMServer() as llm, TestClient(create_app(lambda: live_rt)) as client:
        llm.script(ReplySpec(text=WORDS, chunk_latency=0.2))
        model = {"provider": "openai", "base_url": llm.base_url, "model": "m", "pricing": PRICING}
        body = {"agent": {"kind": "chat", "model": model}, "input": "Tell me a long story."}
        run = client.post("/v1/runs", json=body).json()
        wait_for(lambda: llm.requests, 30, what="the model request")
        cancelled_at = _cancel_at(client, run["id"], llm.requests[0].at, 1.0)
        wait_for(lambda: llm.disconnects, 5, what="the stream closed")
        closed_after = llm.disconnects[0] - cancelled_at
        rows = wait_for(lambda: _usage_rows(live_rt, run["id"]), 10, what="the partial call")
        final = client.get(f"/v1/runs/{run['id']}").json()
        time.sleep(0.5)  # nothing more happens: no second request
        assert len(llm.requests) == 1
    print(f"model stream closed {closed_after:.3f} s after the cancel")
    assert closed_after < STOP_WITHIN_S, closed_after
    [row] = rows
    tokens = f"{row['input_tokens']} in / {row['output_tokens']} out tokens"
    print(f"partial call billed: {tokens}, estimated={row['estimated']}, cost {row['cost']:.6f}")
    assert row["estimated"] and row["committed"] and row["round"] == 1
    assert row["input_tokens"] > 0 and 0 < row["output_tokens"] < 20, row  # a part was streamed
    assert row["cost"] > 0
    assert final["status"] == "cancelled"
    assert final["usage"]["cost"] == pytest.approx(row["cost"]), final["usage"]
    assert final["usage"]["input_tokens"] == row["input_tokens"]


def test_cancel_closes_a_running_http_tool(
    live_rt: Runtime, workers: WorkerProcs, slow_http: SlowHttp
) -> None:
    slow = {
        "name": "slow_lookup",
        "description": "A lookup that takes 10 seconds.",
        "read_only": True,
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        "http": {
            "method": "GET",
            "url": f"http://127.0.0.1:{slow_http.port}/slow?q={{q}}",
            "timeout_s": 30,
        },
    }
    agent = {
        "kind": "agent",
        "tools": [slow],
        "model": {
            "provider": "scripted",
            "replies": [
                {"tool_calls": [{"id": "s1", "name": "slow_lookup", "arguments": {"q": "x"}}]},
                {"text": "never"},
            ],
        },
    }
    workers.start("alpha")
    with TestClient(create_app(lambda: live_rt)) as client:
        run = client.post("/v1/runs", json={"agent": agent, "input": "look it up"}).json()
        assert "id" in run, run
        wait_for(lambda: slow_http.arrived, 30, what="the tool's request")
        cancelled_at = _cancel_at(client, run["id"], slow_http.arrived[0], 1.0)
        wait_for(lambda: slow_http.closed, 5, what="the tool's request closed")
        final = client.get(f"/v1/runs/{run['id']}").json()
    closed_after = slow_http.closed[0] - cancelled_at
    print(f"HTTP tool request closed {closed_after:.3f} s after the cancel")
    assert closed_after < STOP_WITHIN_S, closed_after
    assert final["status"] == "cancelled"


def test_cancelling_a_parent_closes_its_childs_model_stream(
    live_rt: Runtime, workers: WorkerProcs
) -> None:
    workers.start("alpha")
    with FakeLLMServer() as llm, TestClient(create_app(lambda: live_rt)) as client:
        llm.script(ReplySpec(text=WORDS, chunk_latency=0.2))
        model = {"provider": "openai", "base_url": llm.base_url, "model": "m", "pricing": PRICING}
        child = {"kind": "agent", "model": model}
        helper = {"name": "writer", "description": "Writes.", "agent": child, "read_only": True}
        parent = {
            "kind": "agent",
            "tools": [helper],
            "model": {
                "provider": "scripted",
                "replies": [
                    {"tool_calls": [{"id": "c1", "name": "writer", "arguments": {"input": "go"}}]},
                    {"text": "never"},
                ],
            },
        }
        run = client.post("/v1/runs", json={"agent": parent, "input": "delegate"}).json()
        assert "id" in run, run
        wait_for(lambda: llm.requests, 30, what="the child's model request")
        cancelled_at = _cancel_at(client, run["id"], llm.requests[0].at, 1.0)
        wait_for(lambda: llm.disconnects, 5, what="the child's stream closed")
        with live_rt.engine.connect() as conn:
            q = sa.select(runs.c.id, runs.c.status).where(runs.c.parent_run_id == run["id"])
            [(kid, status)] = conn.execute(q).all()
        billed = wait_for(lambda: _usage_rows(live_rt, kid), 10, what="the child's partial call")
        time.sleep(0.3)
        final = client.get(f"/v1/runs/{run['id']}").json()
    closed_after = llm.disconnects[0] - cancelled_at
    print(f"child's model stream closed {closed_after:.3f} s after the parent's cancel")
    assert closed_after < STOP_WITHIN_S, closed_after
    assert final["status"] == "cancelled"
    assert status == "cancelled"
    [row] = billed
    assert row["estimated"] and row["cost"] > 0
    assert final["usage"]["cost"] == pytest.approx(row["cost"]), "the parent pays for its child"


def _descendants(pid: int) -> list[int]:
    """Live (not zombie) processes under ``pid``, from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as fh:
                stat = fh.read()
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if state != "Z":
            parents.setdefault(int(ppid), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def test_cancel_kills_a_running_sandbox(live_rt: Runtime, workers: WorkerProcs) -> None:
    code = "import time\nfor _ in range(100):\n    time.sleep(0.1)\nprint('woke up')"
    agent = {
        "kind": "agent",
        "tools": ["run_python"],
        "model": {
            "provider": "scripted",
            "replies": [
                {"tool_calls": [{"id": "p1", "name": "run_python", "arguments": {"code": code}}]},
                {"text": "never"},
            ],
        },
    }
    workers.start("alpha")
    worker_pid = workers.procs["alpha"].pid
    assert _descendants(worker_pid) == []
    with TestClient(create_app(lambda: live_rt)) as client:
        run = client.post("/v1/runs", json={"agent": agent, "input": "sleep"}).json()
        assert "id" in run, run
        wait_for(lambda: _descendants(worker_pid), 30, what="the sandbox process")
        cancelled_at = _cancel_at(client, run["id"], time.time(), 1.0)
        wait_for(lambda: not _descendants(worker_pid), 5, interval=0.01, what="sandbox killed")
        gone_after = time.time() - cancelled_at
        final = client.get(f"/v1/runs/{run['id']}").json()
    print(f"sandbox process gone {gone_after:.3f} s after the cancel")
    assert gone_after < STOP_WITHIN_S, gone_after
    assert final["status"] == "cancelled"
