"""`treadle up` as a subprocess on a free loopback port (embedded mode: API, worker threads
and reaper in one process, SQLite), for the CLI and browser tests."""

from __future__ import annotations

import importlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import httpx
import pytest

from tests.support import IN_CI, ROOT, wait_for

__all__ = ["cli", "embedded_env", "free_port", "need_module", "treadle_up"]


def need_module(name: str) -> ModuleType:
    """Import a test-only package (playwright, pexpect); missing: fail in CI, skip locally."""
    try:
        return importlib.import_module(name)
    except ImportError:
        msg = f"{name} is not installed (pip install playwright pexpect)"
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def embedded_env(db_dir: Path) -> dict[str, str]:
    """The environment of an embedded treadle on its own SQLite file (no TREADLE_* leaks)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TREADLE_")}
    env["TREADLE_DATABASE_URL"] = f"sqlite:///{db_dir / 'treadle.db'}"
    env["NO_COLOR"] = "1"
    return env


@contextmanager
def treadle_up(db_dir: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """Serve ``treadle up`` until the block ends (``env``: more variables); yields its URL."""
    port = free_port()
    log = open(db_dir / "up.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        [sys.executable, "-m", "scheduler.cli", "up", "--port", str(port)],
        cwd=ROOT,
        env={**embedded_env(db_dir), **(env or {})},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError((db_dir / "up.log").read_text(errors="replace"))
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


def cli(
    *args: str, url: str, stdin: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``treadle ARGS`` against the API at ``url`` (not a terminal: no prompts, no colour)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TREADLE_")}
    env.update(TREADLE_URL=url, NO_COLOR="1", COLUMNS="120")
    return subprocess.run(
        [sys.executable, "-m", "scheduler.cli", *args],
        cwd=ROOT,
        env=env,
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        timeout=timeout,
    )
