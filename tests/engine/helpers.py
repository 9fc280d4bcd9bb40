"""Small helpers for engine tests on the stub broker."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

import tests.plugins  # noqa: F401  (registers the test tools)
from shared.agent.spec import AgentSpec
from shared.engine import commands
from shared.engine.runtime import Runtime
from shared.store import records
from shared.store import runs as run_store
from shared.store.tables import usage


def call(name: str, args: Any = None, id: str | None = None) -> dict[str, Any]:
    return {"id": id, "name": name, "arguments": args if args is not None else {}}


def agent(replies: list[dict[str, Any]], **spec: Any) -> AgentSpec:
    body: dict[str, Any] = {"kind": "agent", "model": {"provider": "scripted", "replies": replies}}
    model_extra = spec.pop("model_extra", {})
    body["model"].update(model_extra)
    body.update(spec)
    return AgentSpec.model_validate(body)


def submit(rt: Runtime, spec: AgentSpec, text: str = "go") -> str:
    row, _ = commands.submit_run(rt, commands.RunInput(agent=spec, input=text))
    return str(row["id"])


def due_work(rt: Runtime, *run_ids: str) -> int:
    """Dispatches the runs would have due if every message were lost now: rounds and tool
    calls that are runnable and held by no live worker (there is no outbox row for them)."""
    from shared.store import redrive

    with rt.engine.connect() as conn:
        ts = run_store.now() + 3600  # as if the re-drive interval had passed
        live_after = run_store.now() - rt.settings.lease_seconds
        rounds = redrive.due_rounds(conn, ts, 0.0, live_after)
        calls = redrive.due_calls(conn, ts, 0.0, live_after)
    ids = set(run_ids)
    return sum(1 for d in rounds if d.run_id in ids) + sum(1 for d in calls if d.run_id in ids)


def run(rt: Runtime, run_id: str) -> Any:
    with rt.engine.connect() as conn:
        row = run_store.get_run(conn, run_id)
    assert row is not None
    return row


def transcript(rt: Runtime, run_id: str) -> list[tuple[str, str, list[str]]]:
    with rt.engine.connect() as conn:
        rows = records.list_messages(conn, run_id)
    return [
        (
            m["role"],
            m["content"] if isinstance(m["content"], str) else str(m["content"]),
            [c["name"] for c in m["tool_calls"] or []],
        )
        for m in rows
    ]


def model_rounds(rt: Runtime, run_id: str, purpose: str = "round") -> int:
    with rt.engine.connect() as conn:
        return int(
            conn.execute(
                sa.select(sa.func.count())
                .select_from(usage)
                .where(usage.c.run_id == run_id, usage.c.purpose == purpose)
            ).scalar_one()
        )
