"""Crons over HTTP: ``POST/GET /v1/crons``, ``GET/PATCH/DELETE /v1/crons/{id}``.

A cron starts a run of its agent on each slot of its schedule (five-field cron expression, in
its IANA timezone). Each slot fires once fleet-wide; after downtime only the latest missed
slot fires, once (``shared.engine.schedule``). A named agent is resolved when the cron is
created: its runs keep that version.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Query, Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool

from scheduler.http import limits
from scheduler.http.agents import resolve, store_lookup
from scheduler.http.auth import Caller, ReadCaller, WriteCaller
from scheduler.http.deps import RuntimeDep
from scheduler.http.routing import api_router
from scheduler.http.schemas import (
    ID_PATTERN,
    NOT_BLANK,
    InputMessage,
    JsonInt,
    PathId,
    TtlSeconds,
)
from shared.agent.spec import AgentSpec
from shared.engine import schedule
from shared.engine.runtime import Runtime
from shared.errors import NotFound
from shared.isotime import iso, iso_or_none
from shared.store import schedules as store
from shared.store.db import reading

__all__ = [
    "CronCreate",
    "CronList",
    "CronPatch",
    "CronView",
    "cron_view",
    "new_cron",
    "router",
    "store_cron",
    "tenant_cron",
]

Schedule = Annotated[
    str,
    Field(
        max_length=120,
        pattern=schedule.CRON_PATTERN,
        description="A cron expression, five fields (minute hour day-of-month month "
        "day-of-week), e.g. `*/15 9-17 * * MON-FRI`",
    ),
]
Timezone = Annotated[
    str,
    Field(
        max_length=64,
        description="An IANA timezone the schedule is read in",
        json_schema_extra={"enum": schedule.TIMEZONES},
    ),
]


class CronCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent: AgentSpec | Annotated[str, Field(min_length=1, max_length=200)] = Field(
        description='An agent spec, or a named agent ("name" is resolved to its latest version now)'
    )
    input: (
        Annotated[str, Field(min_length=1, pattern=NOT_BLANK)]
        | Annotated[list[InputMessage], Field(min_length=1)]
    ) = Field(description="Each run's input (a list of messages ends with the user's)")
    schedule: Schedule
    timezone: Timezone = "UTC"
    thread_id: str | None = Field(
        default=None,
        max_length=40,
        pattern=ID_PATTERN,
        description="Each run joins this thread (its multitask policy applies)",
    )
    metadata: dict[str, Any] | None = None
    priority: JsonInt = Field(default=5, ge=0, le=9)
    ttl_s: TtlSeconds | None = None


class CronPatch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    paused: StrictBool = Field(description="true: no slot fires; false: resume from the next slot")


class CronView(BaseModel):
    id: str
    agent: dict[str, Any]
    agent_ref: str | None
    input: Any
    schedule: str
    timezone: str
    thread_id: str | None
    metadata: dict[str, Any] | None
    paused: bool
    next_run_at: str | None
    last_run_at: str | None
    last_run_id: str | None
    created_at: str
    updated_at: str


class CronList(BaseModel):
    crons: list[CronView]


def cron_view(c: store.Cron) -> CronView:
    """The cron's fields (``meta`` as ``metadata``, the agent as its spec and ref), times in
    ISO 8601; a paused cron has no next run."""
    fields = {name: getattr(c, name) for name in c.__slots__}
    agent = {"agent": c.agent["spec"], "agent_ref": c.agent.get("ref"), "metadata": c.meta}
    times = {
        "next_run_at": iso_or_none(None if c.paused else c.next_fire),
        "last_run_at": iso_or_none(c.last_slot),
        "created_at": iso(c.created_at),
        "updated_at": iso(c.updated_at),
    }
    return CronView.model_validate({**fields, **agent, **times})


def new_cron(rt: Runtime, caller: Caller, body: CronCreate) -> store.Cron:
    value = body.input if isinstance(body.input, str) else [m.model_dump() for m in body.input]
    options = {"priority": body.priority, "ttl_s": body.ttl_s}
    return store_cron(
        rt,
        caller,
        body.agent,
        value,
        schedule_=body.schedule,
        timezone=body.timezone,
        thread_id=body.thread_id,
        metadata=body.metadata,
        options=options,
    )


def store_cron(
    rt: Runtime,
    caller: Caller,
    agent_ref: AgentSpec | str,
    value: str | list[dict[str, Any]],
    *,
    schedule_: str,
    timezone: str,
    thread_id: str | None,
    metadata: dict[str, Any] | None,
    options: dict[str, Any],
) -> store.Cron:
    """Check and store a cron: the agent resolved and policed like a run's (404, 403, 413,
    422), the schedule and timezone (422), the tenant's quota (403), the thread (404); nothing
    is written on a refusal. Its fires count against the caller's key's submissions."""
    agent = resolve(agent_ref, store_lookup(rt, caller.tenant))
    limits.check_size(rt.settings, agent.spec, value)
    limits.police_spec(rt, caller, agent.policed)
    policed = agent.policed
    row = {
        "agent": {
            "spec": agent.spec.model_dump(mode="json", exclude_none=True),
            "ref": agent.ref,
            # what each fire polices again (the policy in force then): the tenant's parts
            "policed": policed.model_dump(mode="json", exclude_none=True)
            if isinstance(policed, AgentSpec)
            else None,
        },
        "input": value,
        "schedule": " ".join(schedule_.split()),
        "timezone": timezone,
        "thread_id": thread_id,
        "meta": metadata,
        "options": {**options, "limit_key": caller.limit_key, "keyed": caller.key_id is not None},
    }
    return schedule.create_cron(rt, row, tenant=caller.tenant)


router = api_router(prefix="/v1", tags=["crons"])


@router.post("/crons", status_code=201, response_model=CronView)
def create(body: CronCreate, rt: RuntimeDep, caller: WriteCaller) -> CronView:
    return cron_view(new_cron(rt, caller, body))


@router.get("/crons", response_model=CronList)
def list_crons(
    rt: RuntimeDep,
    caller: ReadCaller,
    thread_id: Annotated[str | None, Query(max_length=40)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
) -> CronList:
    with reading(rt.engine) as conn:
        rows = store.list_crons(
            conn, caller.tenant, thread_id=thread_id, limit=limit, offset=offset
        )
    return CronList(crons=[cron_view(c) for c in rows])


def tenant_cron(rt: Runtime, tenant: str, cron_id: str) -> store.Cron:
    """The tenant's cron ``cron_id`` (404 when it has none of that id)."""
    with reading(rt.engine) as conn:
        found = store.get_cron(conn, cron_id, tenant)
    if found is None:
        raise NotFound(f"cron {cron_id} not found")
    return found


@router.get("/crons/{cron_id}", response_model=CronView)
def get_cron(cron_id: PathId, rt: RuntimeDep, caller: ReadCaller) -> CronView:
    return cron_view(tenant_cron(rt, caller.tenant, cron_id))


@router.patch("/crons/{cron_id}", response_model=CronView)
def patch_cron(cron_id: PathId, body: CronPatch, rt: RuntimeDep, caller: WriteCaller) -> CronView:
    return cron_view(schedule.pause_cron(rt, caller.tenant, cron_id, body.paused))


@router.delete("/crons/{cron_id}", status_code=204, response_class=Response)
def delete_cron(cron_id: PathId, rt: RuntimeDep, caller: WriteCaller) -> Response:
    schedule.delete_cron(rt, caller.tenant, cron_id)
    return Response(status_code=204)
