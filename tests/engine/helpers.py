"""Small helpers for engine tests on the stub broker."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import RowMapping

import tests.plugins  # noqa: F401  (registers the test tools)
from shared.agent.spec import AgentSpec
from shared.engine import commands
from shared.engine.runtime import Runtime
from shared.store import repo
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


def run(rt: Runtime, run_id: str) -> RowMapping:
    with rt.engine.connect() as conn:
        row = repo.get_run(conn, run_id)
    assert row is not None
    return row


def transcript(rt: Runtime, run_id: str) -> list[tuple[str, str, list[str]]]:
    with rt.engine.connect() as conn:
        rows = repo.list_messages(conn, run_id)
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
