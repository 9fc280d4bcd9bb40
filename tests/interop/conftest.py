"""The interop facades served for real: ``treadle up`` (uvicorn, SQLite, the in-process
embedded worker) on a free loopback port, with scripted agents from an agents file, the test
tools, and a webhook receiver as the operator's default webhook."""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.receiver import Receiver
from tests.support import ROOT, wait_for

SECRET = "whsec_" + base64.b64encode(b"interop-test-secret-0123456789ab").decode()

ASK = {
    "reason": "I need the environment",
    "questions": [
        {
            "question": "Env?",
            "options": [{"label": "Prod", "value": "prod"}, {"label": "Dev", "value": "dev"}],
        }
    ],
}


def _scripted(*replies: dict[str, Any]) -> dict[str, Any]:
    return {"provider": "scripted", "replies": list(replies)}


AGENTS: dict[str, dict[str, Any]] = {
    "it-chat": {
        "kind": "chat",
        "model": _scripted({"text": "Hello there, friend.", "reasoning": "Say hi."}),
    },
    "it-ask": {
        "kind": "agent",
        "ask": True,
        "model": _scripted(
            {"tool_calls": [{"id": "call_9", "name": "ask_user", "arguments": ASK}]},
            {"text": "Deploying now."},
        ),
    },
    "it-guard": {
        "kind": "agent",
        "guarded": True,
        "parallel_tools": 2,
        "tools": ["echo", "write_thing"],
        "model": _scripted(
            {
                "tool_calls": [
                    {"id": "r1", "name": "echo", "arguments": {"text": "read it"}},
                    {"id": "w1", "name": "write_thing", "arguments": {"item": "A"}},
                    {"id": "w2", "name": "write_thing", "arguments": {"item": "B"}},
                ]
            },
            {"text": "Wrote A; B was declined."},
        ),
    },
    "it-tool": {
        "kind": "agent",
        "tools": ["echo"],
        "model": _scripted(
            {"tool_calls": [{"id": "e1", "name": "echo", "arguments": {"text": "ping"}}]},
            # the pause lets a stream opened right after the submit subscribe before the deltas
            {"text": "The echo said ping.", "reasoning": "I have the result.", "sleep": 0.3},
        ),
    },
    "it-slow": {"kind": "chat", "model": _scripted({"text": "too late", "sleep": 4})},
    # /mcp and /a2a: a model that takes 12 s (a run longer than a call waits), structured
    # output, an approval
    "it-12s": {"kind": "chat", "model": _scripted({"text": "Finally done.", "sleep": 12})},
    "it-struct": {
        "kind": "agent",
        "output_schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "temp_c": {"type": "integer"}},
            "required": ["city", "temp_c"],
        },
        "model": _scripted({"text": '{"city": "Paris", "temp_c": 21}'}),
    },
    "it-approve": {
        "kind": "agent",
        "guarded": True,
        "tools": ["write_thing"],
        "model": _scripted(
            {"tool_calls": [{"id": "w1", "name": "write_thing", "arguments": {"item": "A"}}]},
            {"text": "Wrote A."},
        ),
    },
    "it-long": {
        "kind": "chat",
        "model": _scripted({"text": " ".join(f"word{i}" for i in range(40)), "sleep": 0.5}),
    },
}


@dataclass
class Served:
    url: str
    effects: Path
    receiver: Receiver


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(tmp: Path, receiver: Receiver) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TREADLE_")}
    agents = tmp / "agents.yaml"
    agents.write_text(yaml.safe_dump(AGENTS), encoding="utf-8")
    env.update(
        {
            "TREADLE_DATABASE_URL": f"sqlite:///{tmp / 'interop.db'}",
            "TREADLE_AGENTS_FILE": str(agents),
            "TREADLE_PLUGINS": "tests.plugins",
            "TREADLE_TEST_EFFECTS": str(tmp / "effects.log"),
            "TREADLE_ALLOW_HOSTS": "127.0.0.1",
            "TREADLE_WEBHOOK_URL": receiver.url,
            "TREADLE_WEBHOOK_SECRET_ENV": "INTEROP_HOOK_SECRET",
            "INTEROP_HOOK_SECRET": SECRET,
            "TREADLE_REAPER_INTERVAL": "1",
            "TREADLE_CALL_WAIT_S": "5",  # /mcp, /a2a: a run still going after 5 s is a handle
        }
    )
    return env


@contextmanager
def _serve(tmp: Path, receiver: Receiver, **extra: str) -> Iterator[str]:
    """``treadle up`` on a free loopback port; yields its URL."""
    port = _free_port()
    log = open(tmp / "up.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        [sys.executable, "-m", "scheduler.cli", "up", "--port", str(port), "-c", "8"],
        cwd=ROOT,
        env={**_env(tmp, receiver), **extra},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError((tmp / "up.log").read_text(errors="replace")[-3000:])
        try:
            return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(ready, 60, what="treadle up")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=15)
        log.close()


@pytest.fixture(scope="session")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("interop")
    receiver = Receiver().start()
    try:
        with _serve(tmp, receiver) as url:
            yield Served(url, tmp / "effects.log", receiver)
    finally:
        receiver.stop()


@dataclass
class Keyed:
    url: str
    keys: dict[str, str]  # tenant → API key
    receiver: Receiver
    key_ids: dict[str, str]  # tenant → the key's id (who decided, in the records)


@pytest.fixture(scope="session")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Keyed]:
    """The facades with API keys required: one key for each of two tenants."""
    from shared.store import keys
    from shared.store.db import make_engine, migrate

    tmp = tmp_path_factory.mktemp("interop-keys")
    engine = make_engine(f"sqlite:///{tmp / 'interop.db'}")
    migrate(engine)
    with engine.begin() as conn:
        made = {t: keys.create_key(conn, t) for t in ("acme", "globex")}
    engine.dispose()
    receiver = Receiver().start()
    secrets = {t: m.secret for t, m in made.items()}
    try:
        with _serve(tmp, receiver, TREADLE_AUTH="required") as url:
            yield Keyed(url, secrets, receiver, {t: m.key.id for t, m in made.items()})
    finally:
        receiver.stop()


class Counter:
    """Requests a client made (a reconnect loop shows up as a count that keeps growing)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str]] = []

    def __call__(self, request: Any) -> None:
        self.requests.append((str(request.method), str(request.url.path)))

    async def async_hook(self, request: Any) -> None:
        self(request)

    def count(self, fragment: str = "", method: str | None = None) -> int:
        return sum(1 for m, p in self.requests if fragment in p and (method is None or m == method))
