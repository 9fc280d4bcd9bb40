"""Resume, provider waits, fork and steer in embedded mode: ``treadle up`` (SQLite, worker
threads and the reaper in one process) against the fake model server, and ``treadle resume``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared.llm.fake_server import FakeLLMServer
from tests.e2e.servers import cli, treadle_up
from tests.support import RoundsModel, requests_per_round, wait_for

FINAL = ("completed", "failed", "cancelled")


@pytest.fixture
def up(tmp_path: Path) -> Iterator[str]:
    env = {
        "TREADLE_REAPER_INTERVAL": "0.3",
        "TREADLE_PROVIDER_RETRY_S": "0.5",
        "TREADLE_PLUGINS": "tests.plugins",
    }
    with treadle_up(tmp_path, env) as url:
        yield url


def _agent(llm: FakeLLMServer, **spec: Any) -> dict[str, Any]:
    model = {"provider": "openai", "base_url": llm.base_url, "model": "m", "max_retries": 1}
    return {"kind": "agent", "tools": ["echo"], "max_rounds": 100, "model": model, **spec}


def _until(url: str, run_id: str, *wanted: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        run: dict[str, Any] = httpx.get(f"{url}/v1/runs/{run_id}").json()
        return run if run["status"] in wanted else None

    found: dict[str, Any] = wait_for(check, 60, what="/".join(wanted))
    return found


def test_outages_resume_and_wait_in_embedded_mode(up: str) -> None:
    model = RoundsModel(20)
    model.down, model.down_from = True, 8
    with FakeLLMServer(model) as llm:
        body = {"agent": _agent(llm, provider_wait_s=0), "input": "twenty steps"}
        run = httpx.post(f"{up}/v1/runs", json=body).json()
        failed = _until(up, run["id"], *FINAL)
        assert failed["status"] == "failed" and failed["round"] == 7
        model.down = False
        out = cli("resume", run["id"], url=up)
        assert out.returncode == 0 and "resumed" in out.stdout, out.stderr
        done = _until(up, run["id"], *FINAL)
        counts = requests_per_round(llm)
        assert done["status"] == "completed", done["error"]
        assert all(counts[k] == 1 for k in range(1, 8)), counts

        model.down, model.down_from = True, 3
        waiting = httpx.post(f"{up}/v1/runs", json={"agent": _agent(llm), "input": "w"}).json()
        parked = _until(up, waiting["id"], "waiting")
        assert parked["pending"]["kind"] == "provider"
        model.down = False
        assert _until(up, waiting["id"], *FINAL)["status"] == "completed"


def test_fork_and_steer_in_embedded_mode(up: str) -> None:
    with FakeLLMServer(RoundsModel(6)) as llm:
        run = httpx.post(f"{up}/v1/runs", json={"agent": _agent(llm), "input": "first"}).json()
        assert _until(up, run["id"], *FINAL)["status"] == "completed"
        seen = len(llm.bodies)
        fork = httpx.post(f"{up}/v1/runs/{run['id']}/fork", json={"round": 3, "input": "second"})
        assert fork.status_code == 201, fork.text
        forked = _until(up, fork.json()["id"], *FINAL)
        assert forked["status"] == "completed"
        assert forked["forked_from"] == {"run_id": run["id"], "round": 3}
        first = llm.bodies[seen]["messages"]
        assert sum(m["role"] == "assistant" for m in first) == 3
        assert first[-1] == {"role": "user", "content": "second"}
        late = httpx.post(f"{up}/v1/runs/{run['id']}/messages", json={"content": "more"})
        assert late.status_code == 409
