"""One time format in the API: ISO 8601 UTC everywhere (runs, pending, tool calls, events)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from fastapi.testclient import TestClient

from scheduler.http.sse import _frames
from scheduler.http.tail import Batch
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.isotime import epoch, iso, iso_times

ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")


def _times(value: Any, key: str = "") -> Iterator[tuple[str, Any]]:
    """Every value under a key that names a time (``*_at``, ``ts``), anywhere in a body."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _times(v, str(k))
    elif isinstance(value, list):
        for v in value:
            yield from _times(v, key)
    elif key.endswith("_at") or key == "ts":
        yield key, value


def _all_iso(body: Any) -> list[tuple[str, Any]]:
    found = [(k, v) for k, v in _times(body) if v is not None]
    assert found, body
    return [(k, v) for k, v in found if not (isinstance(v, str) and ISO.fullmatch(v))]


def test_runs_pending_and_tool_calls_are_iso(
    client: TestClient, sqlite_rt: Runtime, stub: StubBroker
) -> None:
    done = client.post("/v1/runs", json={"agent": "demo", "input": "2+2, and the time?"}).json()
    asking = client.post(
        "/v1/runs", json={"agent": "demo-assistant", "input": "Please save a note for me."}
    ).json()
    stub.drain(sqlite_rt)
    calls = client.get(f"/v1/runs/{done['id']}/tool-calls").json()
    waiting = client.get(f"/v1/runs/{asking['id']}").json()
    assert waiting["status"] == "waiting" and waiting["pending"]["asked_at"]
    for body in (client.get(f"/v1/runs/{done['id']}").json(), calls, waiting):
        assert _all_iso(body) == []
    assert _all_iso(client.get("/v1/runs").json()) == []


def test_sse_events_carry_iso_times() -> None:
    event = {"seq": 3, "type": "run.waiting", "created_at": 1.5, "data": {"pending": {}}}
    event["data"]["pending"] = {"asked_at": 1.5, "expires_at": None, "kind": "ask"}
    frame = _frames("r", Batch([event]))
    body = json.loads(frame.split("data: ", 1)[1])
    assert body["ts"] == "1970-01-01T00:00:01.500000Z"
    assert body["data"]["pending"]["asked_at"] == body["ts"]


def test_iso_round_trips_and_only_times_change() -> None:
    assert epoch(iso(1_700_000_000.25)) == 1_700_000_000.25
    doc = {"asked_at": 2.0, "seq": 2, "answered": True, "nested": [{"wake_at": 0}]}
    assert iso_times(doc) == {
        "asked_at": "1970-01-01T00:00:02Z",
        "seq": 2,
        "answered": True,
        "nested": [{"wake_at": "1970-01-01T00:00:00Z"}],
    }
