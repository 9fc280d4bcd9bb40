"""LangGraph crons (``client.crons.*``) on treadle's crons (``scheduler.http.cron_routes``):
``POST /runs/crons`` (stateless: each run on no thread), ``POST /threads/{id}/runs/crons``
(each run joins the thread), ``POST /runs/crons/search``, ``POST /runs/crons/count``,
``PATCH /runs/crons/{id}`` (``enabled``), ``DELETE /runs/crons/{id}``.

The runs a cron starts are treadle runs (``GET /v1/runs``, metadata ``cron_id``); they are not
listed as the thread's LangGraph runs.
"""

from __future__ import annotations

from typing import Any

from fastapi import Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool

from scheduler.http.auth import ReadCaller, WriteCaller
from scheduler.http.cron_routes import Schedule, store_cron, tenant_cron
from scheduler.http.deps import RuntimeDep
from scheduler.http.routing import api_router
from scheduler.http.schemas import JsonInt
from scheduler.interop.langgraph.bodies import LgInput
from shared.engine import schedule
from shared.engine.runtime import Runtime
from shared.errors import NotFound
from shared.interop.shapes import input_messages
from shared.interop.thread_ids import public_id, scoped_id
from shared.isotime import iso, iso_or_none
from shared.store import schedules as store
from shared.store import threads as thread_store
from shared.store.db import reading

__all__ = ["router"]

_TIMEZONE = Field(
    default=None, max_length=64, json_schema_extra={"enum": [*schedule.TIMEZONES, None]}
)


class CronBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    assistant_id: str = Field(min_length=1, max_length=200)
    schedule: Schedule
    input: LgInput
    metadata: dict[str, Any] | None = None
    timezone: str | None = _TIMEZONE
    enabled: StrictBool | None = None


class CronPatchBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    enabled: StrictBool | None = None


class CronSearchBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    assistant_id: str | None = Field(default=None, max_length=200)
    thread_id: str | None = Field(default=None, max_length=64)
    enabled: StrictBool | None = None
    limit: JsonInt = Field(default=10, ge=1, le=1000)
    offset: JsonInt = Field(default=0, ge=0, le=1_000_000)


def _view(c: store.Cron) -> dict[str, Any]:
    options = c.options or {}
    return {
        "cron_id": c.id,
        "assistant_id": options.get("assistant_id") or c.agent.get("ref"),
        "thread_id": public_id(c.thread_id) if c.thread_id else None,
        "on_run_completed": None,
        "end_time": None,
        "schedule": c.schedule,
        "timezone": c.timezone,
        "created_at": iso(c.created_at),
        "updated_at": iso(c.updated_at),
        "payload": {"input": {"messages": c.input}, "assistant_id": options.get("assistant_id")},
        "user_id": None,
        "next_run_date": iso_or_none(None if c.paused else c.next_fire),
        "metadata": c.meta or {},
        "enabled": not c.paused,
    }


def _stored_thread(rt: Runtime, tenant: str, thread_id: str) -> str:
    """The stored id of the thread a LangGraph client calls ``thread_id`` (a name it chose
    is stored scoped to its tenant, ``shared.interop.thread_ids``); NotFound."""
    with reading(rt.engine) as conn:
        for candidate in (scoped_id(tenant, thread_id), thread_id):
            if thread_store.get_thread(conn, candidate, tenant) is not None:
                return candidate
    raise NotFound(f"thread {thread_id} not found")


def _create(rt: Runtime, caller: Any, thread_id: str | None, body: CronBody) -> dict[str, Any]:
    msgs = input_messages(
        [m if isinstance(m, str) else m.model_dump(exclude_none=True) for m in body.input.messages]
    )
    cron = store_cron(
        rt,
        caller,
        body.assistant_id,
        msgs,
        schedule_=body.schedule,
        timezone=body.timezone or "UTC",
        thread_id=thread_id,
        metadata=body.metadata,
        options={"assistant_id": body.assistant_id, "facade": "langgraph"},
    )
    if body.enabled is False:
        cron = schedule.pause_cron(rt, caller.tenant, cron.id, True)
    return _view(cron)


def _search(rt: Runtime, caller: Any, body: CronSearchBody) -> list[store.Cron]:
    thread_id = None
    if body.thread_id is not None:
        try:
            thread_id = _stored_thread(rt, caller.tenant, body.thread_id)
        except NotFound:
            return []
    with reading(rt.engine) as conn:
        rows = store.list_crons(conn, caller.tenant, thread_id=thread_id, limit=10_000)
    if body.assistant_id is not None:
        rows = [c for c in rows if _view(c)["assistant_id"] == body.assistant_id]
    if body.enabled is not None:
        rows = [c for c in rows if c.paused != body.enabled]
    return rows


router = api_router()
"""The crons routes of the LangGraph facade (``langgraph.routes`` includes them)."""


@router.post("/runs/crons")
def create_cron(body: CronBody, rt: RuntimeDep, caller: WriteCaller) -> dict[str, Any]:
    return _create(rt, caller, None, body)


@router.post("/threads/{thread_id}/runs/crons")
def create_thread_cron(
    thread_id: str, body: CronBody, rt: RuntimeDep, caller: WriteCaller
) -> dict[str, Any]:
    return _create(rt, caller, _stored_thread(rt, caller.tenant, thread_id), body)


@router.post("/runs/crons/search")
def search_crons(body: CronSearchBody, rt: RuntimeDep, caller: ReadCaller) -> list[dict[str, Any]]:
    rows = _search(rt, caller, body)
    return [_view(c) for c in rows[body.offset : body.offset + body.limit]]


@router.post("/runs/crons/count")
def count_crons(body: CronSearchBody, rt: RuntimeDep, caller: ReadCaller) -> int:
    return len(_search(rt, caller, body))


@router.patch("/runs/crons/{cron_id}")
def update_cron(
    cron_id: str, body: CronPatchBody, rt: RuntimeDep, caller: WriteCaller
) -> dict[str, Any]:
    if body.enabled is not None:
        return _view(schedule.pause_cron(rt, caller.tenant, cron_id, not body.enabled))
    return _view(tenant_cron(rt, caller.tenant, cron_id))


@router.delete("/runs/crons/{cron_id}", status_code=204, response_class=Response)
def delete_cron(cron_id: str, rt: RuntimeDep, caller: WriteCaller) -> Response:
    schedule.delete_cron(rt, caller.tenant, cron_id)
    return Response(status_code=204)
