"""Deleting over the API on SQLite: a finished 20-round run with a sub-agent run, webhook
deliveries, events, usage and tool calls leaves no row anywhere that names it (every table of
the metadata is inspected, JSON columns too); a running run is 409; another tenant's id 404;
threads, files and datasets; retention by age and by ttl_s; the CLI's prune."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from fastapi.testclient import TestClient

from scheduler.app import create_app
from shared.engine import retention
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.store import keys
from shared.store import runs as run_store
from shared.store.tables import runs
from tests.support import references

ROUNDS = 20


def _scripted(*replies: dict[str, Any]) -> dict[str, Any]:
    return {"provider": "scripted", "replies": list(replies)}


def _long_agent() -> dict[str, Any]:
    child = {"kind": "agent", "model": _scripted({"text": "child done"})}
    replies: list[dict[str, Any]] = [
        {"tool_calls": [{"id": "k1", "name": "helper", "arguments": {"input": "go"}}]}
    ]
    replies += [
        {"tool_calls": [{"id": f"e{i}", "name": "echo", "arguments": {"text": f"{i}"}}]}
        for i in range(2, ROUNDS)
    ]
    replies.append({"text": "all done"})
    helper = {"name": "helper", "description": "help", "agent": child, "read_only": True}
    return {"kind": "agent", "model": _scripted(*replies), "tools": ["echo", helper]}


def _finish(client: TestClient, stub: StubBroker, rt: Runtime, body: dict[str, Any]) -> str:
    run_id = str(client.post("/v1/runs", json=body).json()["id"])
    stub.drain(rt)
    assert client.get(f"/v1/runs/{run_id}").json()["status"] == "completed"
    return run_id


def test_delete_run_leaves_no_row_naming_it(
    client: TestClient, stub: StubBroker, sqlite_rt: Runtime
) -> None:
    body = {
        "agent": _long_agent(),
        "input": "work",
        "webhook": {"url": "http://127.0.0.1:9/hook"},  # nobody listens: deliveries stay
    }
    run_id = _finish(client, stub, sqlite_rt, body)
    assert client.get(f"/v1/runs/{run_id}").json()["round"] >= ROUNDS
    with sqlite_rt.engine.connect() as conn:
        kids = [
            str(i)
            for i in conn.execute(
                sa.select(runs.c.id).where(runs.c.parent_run_id == run_id)
            ).scalars()
        ]
    assert len(kids) == 1
    before = references(sqlite_rt, {run_id, *kids})
    for table in ("messages", "events", "usage", "tool_calls", "webhook_deliveries", "run_specs"):
        assert any(k.startswith(f"{table}.") for k in before), (table, before)
    other = _finish(client, stub, sqlite_rt, {"agent": _long_agent(), "input": "keep me"})
    assert client.delete(f"/v1/runs/{kids[0]}").status_code == 409  # goes with its parent
    assert client.delete(f"/v1/runs/{run_id}").status_code == 204
    assert references(sqlite_rt, {run_id, *kids}) == {}
    assert client.get(f"/v1/runs/{run_id}").status_code == 404
    assert client.delete(f"/v1/runs/{run_id}").status_code == 404
    assert client.get(f"/v1/runs/{other}/messages").json()["messages"]  # others untouched


def test_a_run_not_ended_is_409(client: TestClient, stub: StubBroker, sqlite_rt: Runtime) -> None:
    run = client.post("/v1/runs", json={"agent": _long_agent(), "input": "x"}).json()
    assert client.delete(f"/v1/runs/{run['id']}").status_code == 409
    scheduled = client.post("/v1/runs", json={"agent": _long_agent(), "input": "x", "delay_s": 60})
    assert client.delete(f"/v1/runs/{scheduled.json()['id']}").status_code == 409
    assert client.get(f"/v1/runs/{run['id']}").json()["status"] == "queued"


def test_threads_keep_history_until_the_whole_thread_goes(
    client: TestClient, stub: StubBroker, sqlite_rt: Runtime
) -> None:
    chat = {"kind": "chat", "model": _scripted({"text": "ok"})}
    tid = client.post("/v1/threads", json={}).json()["id"]
    first = _finish(client, stub, sqlite_rt, {"agent": chat, "input": "a", "thread_id": tid})
    second = _finish(client, stub, sqlite_rt, {"agent": chat, "input": "b", "thread_id": tid})
    r = client.delete(f"/v1/runs/{first}")
    assert r.status_code == 409 and second in r.text  # the second run reads it as history
    assert client.delete(f"/v1/threads/{tid}").status_code == 204
    assert references(sqlite_rt, {tid, first, second}) == {}
    assert client.get(f"/v1/threads/{tid}").status_code == 404


def test_files_and_datasets(client: TestClient) -> None:
    up = client.post("/v1/files", files={"file": ("a.txt", b"hello", "text/plain")}).json()
    assert client.delete(f"/v1/files/{up['id']}").status_code == 204
    assert client.get(f"/v1/files/{up['id']}").status_code == 404
    assert client.delete(f"/v1/files/{up['id']}").status_code == 404
    ds = client.post("/v1/datasets", json={"name": "kb"}).json()
    doc = client.post(
        f"/v1/datasets/{ds['id']}/documents",
        files={"file": ("n.md", b"# Hi\nsome text", "text/markdown")},
    )
    assert doc.status_code in (200, 201), doc.text
    assert client.delete(f"/v1/datasets/{ds['id']}").status_code == 204
    assert client.get(f"/v1/datasets/{ds['id']}").status_code == 404


def test_deletes_are_tenant_scoped(sqlite_rt: Runtime, stub: StubBroker) -> None:
    with sqlite_rt.engine.begin() as conn:
        a = keys.create_key(conn, "acme", [keys.READ, keys.WRITE]).secret
        b = keys.create_key(conn, "bravo", [keys.READ, keys.WRITE]).secret
    chat = {"kind": "chat", "model": _scripted({"text": "ok"})}
    with TestClient(create_app(lambda: sqlite_rt, auth="required")) as c:
        ha, hb = {"Authorization": f"Bearer {a}"}, {"Authorization": f"Bearer {b}"}
        run_id = c.post("/v1/runs", json={"agent": chat, "input": "x"}, headers=ha).json()["id"]
        stub.drain(sqlite_rt)
        tid = c.post("/v1/threads", json={}, headers=ha).json()["id"]
        fid = c.post("/v1/files", files={"file": ("a.txt", b"x", "text/plain")}, headers=ha).json()[
            "id"
        ]
        ds = c.post("/v1/datasets", json={"name": "kb"}, headers=ha).json()["id"]
        for path in (f"runs/{run_id}", f"threads/{tid}", f"files/{fid}", f"datasets/{ds}"):
            assert c.delete(f"/v1/{path}", headers=hb).status_code == 404, path
        for path in (f"runs/{run_id}", f"threads/{tid}", f"files/{fid}", f"datasets/{ds}"):
            assert c.delete(f"/v1/{path}", headers=ha).status_code == 204, path


def test_retention_by_age_and_ttl(client: TestClient, stub: StubBroker, sqlite_rt: Runtime) -> None:
    chat = {"kind": "chat", "model": _scripted({"text": "ok"})}
    old = _finish(client, stub, sqlite_rt, {"agent": chat, "input": "old"})
    short = _finish(client, stub, sqlite_rt, {"agent": chat, "input": "ttl", "ttl_s": 30})
    keep = _finish(client, stub, sqlite_rt, {"agent": chat, "input": "keep"})
    with sqlite_rt.engine.begin() as conn:
        conn.execute(
            sa.update(runs).where(runs.c.id == old).values(updated_at=run_store.now() - 40 * 86400)
        )
    # retention off: only the ttl run, once its ttl has passed
    assert retention.purge(sqlite_rt).deleted == 0
    assert retention.purge(sqlite_rt, now=run_store.now() + 31).deleted == 1
    assert retention.purge(sqlite_rt, older_than_s=30 * 86400, dry_run=True).runs == 1
    assert retention.purge(sqlite_rt, older_than_s=30 * 86400).deleted == 1
    assert [client.get(f"/v1/runs/{i}").status_code for i in (old, short, keep)] == [404, 404, 200]


def test_prune_cli(tmp_path: Any) -> None:
    import os
    import subprocess
    import sys

    from shared.store.db import make_engine, migrate
    from tests.support import ROOT

    url = f"sqlite:///{tmp_path / 'cli.db'}"
    engine = make_engine(url)
    migrate(engine)
    with engine.begin() as conn:
        for i, age in enumerate((40, 35, 1)):
            ts = run_store.now() - age * 86400
            conn.execute(
                sa.insert(runs).values(
                    id=f"run_old{i}", kind="chat", status="completed", created_at=ts, updated_at=ts
                )
            )
    engine.dispose()
    env = {**os.environ, "TREADLE_DATABASE_URL": url}

    def prune(*args: str) -> str:
        cmd = [sys.executable, "-m", "scheduler.cli", "prune", *args]
        done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "2 runs would be deleted" in prune("--older-than", "30d", "--dry-run")
    assert "deleted 2 runs" in prune("--older-than", "30d")
    assert "deleted 0 runs" in prune("--older-than", "2w")
    bad = subprocess.run(
        [sys.executable, "-m", "scheduler.cli", "prune", "--older-than", "soon"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2
