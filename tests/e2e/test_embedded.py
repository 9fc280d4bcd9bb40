"""Embedded mode as a user meets it: `treadle up` served over HTTP, and `treadle demo`."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import ROOT, wait_for


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TREADLE_")}
    env["TREADLE_DATABASE_URL"] = f"sqlite:///{tmp_path / 'embedded.db'}"
    return env


@pytest.fixture
def up_server(tmp_path: Path) -> Iterator[str]:
    port = _free_port()
    log = open(tmp_path / "up.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "scheduler.cli", "up", "--port", str(port)],
        cwd=ROOT,
        env=_env(tmp_path),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(ready, 30, what="treadle up")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


def test_up_serves_a_chat_run(up_server: str) -> None:
    body = {"agent": {"kind": "chat", "model": "demo"}, "input": "Say hello"}
    run = httpx.post(f"{up_server}/v1/runs", json=body, timeout=10).json()
    done = wait_for(
        lambda: (
            (r := httpx.get(f"{up_server}/v1/runs/{run['id']}").json())["status"] == "completed"
            and r
        ),
        15,
        what="completed run",
    )
    assert "You asked: Say hello" in done["result"]["text"]
    assert done["usage"]["input_tokens"] > 0
    msgs = httpx.get(f"{up_server}/v1/runs/{run['id']}/messages").json()["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant"]


def test_demo_command_completes(tmp_path: Path) -> None:
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "scheduler.cli", "demo"],
        cwd=ROOT,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "completed" in out.stdout and "391" in out.stdout
    assert time.monotonic() - started < 60
