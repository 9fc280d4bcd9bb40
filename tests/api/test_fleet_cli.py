"""``treadle runs search|cancel --filter`` (a real ``treadle`` process) against an API on
SQLite whose runs stay queued (a stub broker nobody drains)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from shared.engine.runtime import Runtime
from tests.e2e.servers import cli
from tests.live import ApiServer

CHAT = {"kind": "chat", "model": {"provider": "scripted", "replies": [{"text": "Hi."}]}}


@pytest.fixture
def url(sqlite_rt: Runtime) -> Iterator[str]:
    with ApiServer(sqlite_rt) as api:
        yield api.url


def _submit(url: str, meta: dict[str, Any]) -> str:
    body = {"agent": CHAT, "input": "hi", "metadata": meta}
    got = httpx.post(f"{url}/v1/runs", json=body, timeout=10)
    assert got.status_code == 201, got.text
    return str(got.json()["id"])


def test_search_and_cancel_by_filter(url: str) -> None:
    acme = [_submit(url, {"customer": "acme"}) for _ in range(5)]
    other = [_submit(url, {"customer": "globex"}) for _ in range(2)]
    out = cli("runs", "search", "-f", "metadata.customer=acme", "--limit", "3", "--json", url=url)
    assert out.returncode == 0, out.stderr
    page = json.loads(out.stdout)
    assert [r["id"] for r in page["runs"]] == acme[::-1][:3] and page["next_cursor"]
    out = cli("runs", "search", "-f", "metadata.customer=acme", "-f", "status=queued", url=url)
    assert out.returncode == 0 and all(i in out.stdout for i in acme), out.stdout
    out = cli(
        "runs", "cancel", "-f", "metadata.customer=acme", "--limit", "2", "--all", "--json", url=url
    )
    assert out.returncode == 0, out.stderr
    results = json.loads(out.stdout)["results"]
    assert sorted(r["run_id"] for r in results) == sorted(acme)
    assert {r["outcome"] for r in results} == {"cancelled"}
    listed = json.loads(cli("runs", "--status", "queued", "--json", url=url).stdout)["runs"]
    assert sorted(r["id"] for r in listed) == sorted(other)
    bad = cli("runs", "cancel", "-f", "customer=acme", url=url)
    assert bad.returncode == 2 and "bad --filter" in bad.stderr
    assert cli("runs", "cancel", url=url).returncode == 2  # names no runs
