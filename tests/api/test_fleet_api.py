"""Search and bulk actions over HTTP (docs/api.md, "Search and bulk actions"): metadata
search pages through exactly the matching runs (SQLite and PostgreSQL: the containment
index), bulk cancel by filter acts once per run (one event, one webhook delivery each),
suspend parks a run at its round boundary and resume lets it finish (stub broker), and bad
or unbounded input is a 4xx with the error shape that writes nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from scheduler.app import create_app
from shared.agent.spec import AgentSpec, WebhookSpec
from shared.engine import commands
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.store.tables import events, metadata, runs, webhook_deliveries

CHAT = {"kind": "chat", "model": {"provider": "scripted", "replies": [{"text": "Hi."}]}}
TOOLS = {
    "kind": "agent",
    "tools": ["echo"],
    "model": {
        "provider": "scripted",
        "replies": [
            {"tool_calls": [{"id": "e1", "name": "echo", "arguments": {"text": "ping"}}]},
            {"text": "The echo said ping."},
        ],
    },
}
CUSTOMERS = ("acme", "globex", "initech")


@pytest.fixture
def client(any_rt: Runtime) -> Iterator[TestClient]:
    with TestClient(create_app(lambda: any_rt)) as c:
        yield c


def _submit(
    rt: Runtime, n: int, meta: Any, *, webhook: bool = False, spec: Any = CHAT
) -> list[str]:
    hook = WebhookSpec(url="https://hooks.example.com/t", events=["run.cancelled"])
    ids = []
    for i in range(n):
        row, _ = commands.submit_run(
            rt,
            commands.RunInput(
                agent=AgentSpec.model_validate(spec),
                input="hi",
                metadata=meta(i),
                webhook=hook if webhook else None,
            ),
        )
        ids.append(row.id)
    return ids


def _state(rt: Runtime) -> tuple[dict[str, int], list[tuple[Any, ...]]]:
    with rt.engine.connect() as conn:
        counts = {
            t.name: int(conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one())
            for t in metadata.sorted_tables
            if t.name != "workers"
        }
        rows = conn.execute(
            sa.select(runs.c.id, runs.c.version, runs.c.status, runs.c.suspend_at).order_by(
                runs.c.id
            )
        ).all()
    return counts, [tuple(r) for r in rows]


def _pages(client: TestClient, query: str, limit: int) -> list[list[dict[str, Any]]]:
    pages, cursor = [], None
    while True:
        url = f"/v1/runs?{query}&limit={limit}" + (f"&cursor={cursor}" if cursor else "")
        got = client.get(url)
        assert got.status_code == 200, got.text
        pages.append(got.json()["runs"])
        cursor = got.json()["next_cursor"]
        if cursor is None:
            return pages


def test_metadata_search_pages_through_exactly_the_matching_runs(
    any_rt: Runtime, client: TestClient
) -> None:
    ids = _submit(any_rt, 1000, lambda i: {"customer": CUSTOMERS[i % 3], "tier": str(i % 2)})
    acme = {ids[i] for i in range(1000) if i % 3 == 0}
    pages = _pages(client, "metadata.customer=acme", 60)
    seen = [r["id"] for page in pages for r in page]
    assert len(seen) == len(set(seen)) == len(acme) == 334 and set(seen) == acme
    assert all(len(p) == 60 for p in pages[:-1]) and len(pages) == 6
    assert all(r["metadata"]["customer"] == "acme" for p in pages for r in p)
    created = [r["created_at"] for p in pages for r in p]
    assert created == sorted(created, reverse=True)  # newest first, across pages
    both = [
        r["id"] for p in _pages(client, "metadata.customer=acme&metadata.tier=1", 50) for r in p
    ]
    assert set(both) == {ids[i] for i in range(1000) if i % 3 == 0 and i % 2 == 1}
    assert _pages(client, "metadata.customer=nobody", 10) == [[]]
    # other tenants' runs and other filters combine: status, created range
    mid = client.get(f"/v1/runs/{ids[500]}").json()["created_at"]
    newer = [
        r["id"]
        for p in _pages(
            client,
            f"metadata.customer=acme&created_after={mid.replace('+', '%2B')}&status=queued",
            200,
        )
        for r in p
    ]
    assert set(newer) == {ids[i] for i in range(500, 1000) if i % 3 == 0}


def test_bulk_cancel_by_filter_cancels_each_run_once(any_rt: Runtime, client: TestClient) -> None:
    batch = _submit(any_rt, 200, lambda i: {"batch": "b7"}, webhook=True)
    others = _submit(any_rt, 20, lambda i: {"batch": "b8"}, webhook=True)
    body = {"filter": {"metadata": {"batch": "b7"}}, "limit": 150}
    first = client.post("/v1/runs/cancel", json=body)
    assert first.status_code == 200, first.text
    assert first.json()["more"] is True and len(first.json()["results"]) == 150
    second = client.post("/v1/runs/cancel", json=body).json()
    assert second["more"] is False and len(second["results"]) == 50
    results = first.json()["results"] + second["results"]
    assert sorted(r["run_id"] for r in results) == sorted(batch)
    assert {(r["outcome"], r["status"]) for r in results} == {("cancelled", "cancelled")}
    assert client.post("/v1/runs/cancel", json=body).json() == {"results": [], "more": False}
    again = client.post("/v1/runs/cancel", json={"ids": batch[:3] + ["run_nope"]}).json()
    assert [r["outcome"] for r in again["results"]] == ["skipped"] * 3 + ["not_found"]
    with any_rt.engine.connect() as conn:
        cancelled = conn.execute(
            sa.select(events.c.run_id, sa.func.count())
            .where(events.c.type == "run.cancelled")
            .group_by(events.c.run_id)
        ).all()
        hooks = conn.execute(
            sa.select(webhook_deliveries.c.run_id, sa.func.count()).group_by(
                webhook_deliveries.c.run_id
            )
        ).all()
        statuses = dict(conn.execute(sa.select(runs.c.id, runs.c.status)).all())
    assert dict(cancelled) == dict.fromkeys(batch, 1)  # one event per run, none twice
    assert dict(hooks) == dict.fromkeys(batch, 1)  # one webhook per run
    assert {statuses[i] for i in others} == {"queued"}


def test_suspend_parks_at_the_round_boundary_and_resume_finishes(
    sqlite_rt: Runtime, stub: StubBroker
) -> None:
    rt = sqlite_rt
    with TestClient(create_app(lambda: rt)) as client:
        idle, busy = (
            _submit(rt, 1, lambda i: None)[0],
            _submit(rt, 1, lambda i: None, spec=TOOLS)[0],
        )
        stub.queue.clear()  # the rounds' first dispatches: deliver busy's only
        stub.deliver(rt, stub.sent[-1])  # busy's round 1: its tool call is queued
        got = client.post("/v1/runs/suspend", json={"ids": [idle, busy]}).json()
        assert [(r["outcome"], r["status"]) for r in got["results"]] == [
            ("suspended", "waiting"),  # between rounds: parked at once
            ("suspending", "running"),  # its tool is in flight: parks at the boundary
        ]
        stub.drain(rt)  # busy's tool ends; the round it queues is not run
        for run_id in (idle, busy):
            view = client.get(f"/v1/runs/{run_id}").json()
            assert view["status"] == "waiting" and view["pending"]["kind"] == "suspended"
        assert not any(d.kind == "round" for d in stub.queue)
        with rt.engine.connect() as conn:
            held = conn.execute(sa.select(runs.c.lease_owner).where(runs.c.id.in_([idle, busy])))
            assert {r[0] for r in held} == {None}
        again = client.post("/v1/runs/suspend", json={"ids": [busy]}).json()["results"]
        assert again[0]["outcome"] == "skipped"
        resumed = client.post("/v1/runs/resume", json={"filter": {"status": ["waiting"]}}).json()
        assert sorted(r["run_id"] for r in resumed["results"]) == sorted([idle, busy])
        stub.drain(rt)
        for run_id in (idle, busy):
            assert client.get(f"/v1/runs/{run_id}").json()["status"] == "completed"
        kinds = [e for e in _types(rt, busy) if e.startswith("run.")]
        assert kinds == ["run.queued", "run.suspended", "run.resumed", "run.completed"]


def _types(rt: Runtime, run_id: str) -> list[str]:
    with rt.engine.connect() as conn:
        q = sa.select(events.c.type).where(events.c.run_id == run_id).order_by(events.c.seq)
        return [str(t) for t in conn.execute(q).scalars()]


@pytest.mark.parametrize(
    ("method", "url", "body"),
    [
        ("POST", "/v1/runs/cancel", {}),  # neither ids nor filter
        ("POST", "/v1/runs/cancel", {"ids": ["run_a"], "filter": {"status": ["queued"]}}),
        ("POST", "/v1/runs/cancel", {"filter": {}}),  # an empty filter: not "every run"
        ("POST", "/v1/runs/cancel", {"filter": {"metadata": {}, "status": []}}),
        ("POST", "/v1/runs/cancel", {"filter": {"agent": None, "status": ["queued"]}}),
        ("POST", "/v1/runs/cancel", {"ids": ["run_a"], "limit": 5}),  # limit: a filter's
        ("GET", "/v1/runs?created_after=1764000000", None),  # epoch seconds: not ISO 8601
        ("POST", "/v1/runs/suspend", {"ids": [f"run_{i}" for i in range(501)]}),
        ("POST", "/v1/runs/suspend", {"filter": {"status": ["queued"]}, "limit": 501}),
        ("POST", "/v1/runs/resume", {"ids": []}),
        ("POST", "/v1/runs/resume", {"ids": ["run a"]}),
        ("POST", "/v1/runs/cancel", {"filter": {"metadata": {"bad key": "x"}}}),
        ("POST", "/v1/runs/cancel", {"filter": {"metadata": {f"k{i}": "x" for i in range(9)}}}),
        ("POST", "/v1/runs/cancel", {"filter": {"created_after": "2026-01-01T00:00:00"}}),
        ("POST", "/v1/runs/cancel", {"filter": {"status": ["asleep"]}}),
        ("POST", "/v1/runs/cancel", {"filter": {"agent": "no/such"}}),
        ("GET", "/v1/runs?metadata.bad%20key=x", None),
        ("GET", "/v1/runs?metadata=x", None),
        ("GET", "/v1/runs?metadata.a=1&metadata.a=2", None),
        ("GET", "/v1/runs?" + "&".join(f"metadata.k{i}=v" for i in range(9)), None),
        ("GET", "/v1/runs?metadata.k=" + "v" * 257, None),
        ("GET", "/v1/runs?metadata.k=a%00b", None),
        ("POST", "/v1/runs/cancel", {"filter": {"metadata": {"k": "a\u0000b"}}}),
        ("GET", "/v1/runs?created_after=yesterday", None),
        ("GET", "/v1/runs?created_after=2026-01-01T00:00:00", None),  # no offset
        ("GET", "/v1/runs?status=asleep", None),
        ("GET", "/v1/runs?agent=no/such", None),
    ],
)
def test_bad_input_is_refused_and_writes_nothing(
    sqlite_rt: Runtime, method: str, url: str, body: Any
) -> None:
    _submit(sqlite_rt, 3, lambda i: {"customer": "acme"})
    before = _state(sqlite_rt)
    with TestClient(create_app(lambda: sqlite_rt)) as client:
        got = client.request(method, url, json=body)
    assert 400 <= got.status_code < 500, got.text
    assert set(got.json()["error"]) >= {"code", "message"}
    assert _state(sqlite_rt) == before


def test_a_resumed_run_waits_for_its_tenants_admission(
    sqlite_rt: Runtime, stub: StubBroker
) -> None:
    settings = sqlite_rt.settings.model_copy(update={"tenant_active_runs": 1})
    rt = Runtime(engine=sqlite_rt.engine, settings=settings, publish=stub)
    with TestClient(create_app(lambda: rt)) as client:
        first = _submit(rt, 1, lambda i: None)[0]
        parked = client.post("/v1/runs/suspend", json={"ids": [first]}).json()["results"]
        assert parked[0]["outcome"] == "suspended"
        second = _submit(rt, 1, lambda i: None)[0]  # the suspended run holds no slot
        assert client.get(f"/v1/runs/{second}").json()["status"] == "queued"
        back = client.post("/v1/runs/resume", json={"ids": [first]}).json()["results"]
        assert (back[0]["outcome"], back[0]["status"]) == ("resumed", "queued")
        with rt.engine.connect() as conn:
            held = conn.execute(sa.select(runs.c.held).where(runs.c.id == first)).scalar_one()
        assert held  # waits to be admitted: the tenant's slot is the second run's
        stub.drain(rt)
        for run_id in (first, second):
            assert client.get(f"/v1/runs/{run_id}").json()["status"] == "completed"
