"""One time format in the API: ISO 8601 UTC everywhere (runs, pending, tool calls, events):
every key that names a time (``*_at``, ``at``, ``since``, an event's ``ts``) holds an ISO string,
in the bodies and in the SSE frames; the console's and the CLI's readers take them."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from fastapi.testclient import TestClient

from scheduler.app import create_app
from scheduler.cli.livestate import _epoch
from scheduler.http.sse import _frames
from scheduler.http.tail import Batch
from shared.agent.spec import ModelProfile
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.isotime import epoch, is_time_key, iso, iso_times
from shared.store import records

ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")


def _times(value: Any, key: str = "") -> Iterator[tuple[str, Any]]:
    """Every value under a key that names a time (``*_at``, ``ts``), anywhere in a body."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _times(v, str(k))
    elif isinstance(value, list):
        for v in value:
            yield from _times(v, key)
    elif is_time_key(key) or key == "ts":
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


def _stored_frames(rt: Runtime, run_id: str) -> list[dict[str, Any]]:
    """Every stored event of the run as the SSE route frames it."""
    with rt.engine.connect() as conn:
        rows = [dict(r) for r in records.list_events(conn, run_id)]
    frames = _frames(run_id, Batch(rows)).split("\n\n")
    return [json.loads(f.split("data: ", 1)[1]) for f in frames if "data: " in f]


def test_a_decision_at_is_iso_in_tool_calls_and_events(
    client: TestClient, sqlite_rt: Runtime, stub: StubBroker
) -> None:
    rid = client.post("/v1/runs", json={"agent": "demo-assistant", "input": "Save a note"}).json()
    rid = rid["id"]
    stub.drain(sqlite_rt)
    pending = client.get(f"/v1/runs/{rid}").json()["pending"]
    client.post(f"/v1/runs/{rid}/answer", json={"ask_id": pending["ask_id"], "answers": ["x"]})
    stub.drain(sqlite_rt)
    pending = client.get(f"/v1/runs/{rid}").json()["pending"]
    approval = {"approval_id": pending["approval_id"], "approve": "all"}
    assert client.post(f"/v1/runs/{rid}/approval", json=approval).status_code == 200
    stub.drain(sqlite_rt)
    calls = client.get(f"/v1/runs/{rid}/tool-calls").json()["tool_calls"]
    decided = [c["decision"] for c in calls if c["decision"]]
    assert decided and all(ISO.fullmatch(d["at"]) for d in decided), decided
    assert _all_iso(calls) == []
    frames = _stored_frames(sqlite_rt, rid)
    resumed = [f for f in frames if f["type"] == "run.resumed"]
    assert any("'at'" in str(f["data"]) for f in resumed), resumed
    assert _all_iso(frames) == []
    started = [c for c in calls if c["started_at"]]  # the CLI's tool rows read them back
    assert started and all(_epoch(c["started_at"]) for c in started)


DEAD = "http://127.0.0.1:9/v1"  # nothing listens on the discard port


def test_a_provider_outage_since_is_iso_in_the_run_and_its_events(
    sqlite_rt: Runtime, stub: StubBroker
) -> None:
    """A run waiting out its provider: ``pending.since`` and ``retry_at``, in the run view and
    the ``provider.waiting`` event, are ISO 8601 (they are epoch seconds in the database)."""
    profile = {"name": "down", "provider": "openai", "base_url": DEAD, "model": "m"}
    down = ModelProfile.model_validate({**profile, "max_retries": 1, "timeout_connect": 1.0})
    rt = replace(sqlite_rt, profiles={"down": down.as_operator()})
    spec = {"kind": "agent", "model": "down", "provider_wait_s": 600}
    with TestClient(create_app(lambda: rt)) as api:
        rid = api.post("/v1/runs", json={"agent": spec, "input": "go"}).json()["id"]
        stub.drain(rt)
        run = api.get(f"/v1/runs/{rid}").json()
    pending = run["pending"]
    assert run["status"] == "waiting" and pending["kind"] == "provider", run
    assert ISO.fullmatch(pending["since"]) and ISO.fullmatch(pending["retry_at"]), pending
    assert epoch(pending["since"]) <= epoch(pending["retry_at"])
    assert _all_iso(run) == []
    waiting = [f for f in _stored_frames(rt, rid) if f["type"] == "provider.waiting"]
    assert waiting and ISO.fullmatch(waiting[0]["data"]["pending"]["since"]), waiting


def test_iso_round_trips_and_only_times_change() -> None:
    assert epoch(iso(1_700_000_000.25)) == 1_700_000_000.25
    doc = {"asked_at": 2.0, "seq": 2, "answered": True, "nested": [{"wake_at": 0}]}
    doc |= {"decision": {"at": 3.0, "by": "k"}, "since": 4.0, "tries": 2}
    assert iso_times(doc) == {
        "asked_at": "1970-01-01T00:00:02Z",
        "seq": 2,
        "answered": True,
        "nested": [{"wake_at": "1970-01-01T00:00:00Z"}],
        "decision": {"at": "1970-01-01T00:00:03Z", "by": "k"},
        "since": "1970-01-01T00:00:04Z",
        "tries": 2,
    }
