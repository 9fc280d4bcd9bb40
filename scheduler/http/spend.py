"""Spend envelopes over the API (docs/cost.md): what a tenant may spend on models per day or
calendar month — its whole tenant, a named agent (any version), a cron — with what is spent
and reserved by calls in flight. Raising a cap (or removing an envelope) lets the runs that
wait for it go on at the reaper's next pass."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import Path, Response
from pydantic import BaseModel, ConfigDict, Field

from scheduler.http.agents import AGENT_NAME
from scheduler.http.auth import ReadCaller, WriteCaller
from scheduler.http.deps import RuntimeDep
from scheduler.http.routing import api_router
from scheduler.http.schemas import NUMBER
from shared.agent.spend import Period
from shared.engine.runtime import Runtime
from shared.errors import NotFound
from shared.isotime import iso
from shared.store import runs as run_store
from shared.store import schedules
from shared.store import spend as store
from shared.store.db import reading

__all__ = ["EnvelopeBody", "EnvelopeList", "EnvelopeView", "router"]

router = api_router(tags=["spend"])
Scope = Literal["tenant", "agent", "cron"]


class EnvelopeBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cap: Annotated[float, NUMBER] = Field(
        ge=0, le=1e9, description="What may be spent in a period (the profiles' currency)"
    )
    period: Period = Field(description="day or month: in the operator's TREADLE_TIMEZONE")
    on_exceed: Literal["wait", "fail"] = Field(
        default="wait",
        description="A run whose call the envelope cannot afford: waits (holding nothing) "
        "until the period turns or the cap is raised, or fails at once (budget_envelope)",
    )


class EnvelopeView(BaseModel):
    scope: Scope
    key: str | None = Field(description="The agent's name or the cron's id; null: the tenant's")
    period: Period
    cap: float
    on_exceed: str
    spent: float
    reserved: float = Field(description="The worst case of the calls in flight")
    left: float
    period_start: str
    period_end: str


class EnvelopeList(BaseModel):
    envelopes: list[EnvelopeView]


def _view(e: store.Envelope) -> EnvelopeView:
    return EnvelopeView(
        scope=e.scope,  # type: ignore[arg-type]
        key=e.key or None,
        period=e.period,  # type: ignore[arg-type]
        cap=e.cap,
        on_exceed=e.on_exceed,
        spent=round(e.spent, 8),
        reserved=round(e.reserved, 8),
        left=round(max(e.left, 0.0), 8),
        period_start=iso(e.period_start),
        period_end=iso(e.period_end),
    )


AgentName = Annotated[str, Path(pattern=AGENT_NAME, description="The agent's name (any version)")]
CronId = Annotated[str, Path(min_length=1, max_length=40, pattern=r"^[A-Za-z0-9_-]+$")]


@router.get("/v1/spend", response_model=EnvelopeList)
def list_envelopes(rt: RuntimeDep, caller: ReadCaller) -> EnvelopeList:
    """The tenant's envelopes, each with what is spent and reserved in its current period."""
    with rt.engine.begin() as conn:
        store.roll(conn, caller.tenant, run_store.now(), rt.settings.timezone)
        found = store.list_envelopes(conn, caller.tenant)
    return EnvelopeList(envelopes=[_view(e) for e in found])


def _put(rt: Runtime, tenant: str, scope: str, key: str, body: EnvelopeBody) -> EnvelopeView:
    """Create or change an envelope; the tenant's runs waiting for one go on."""
    with rt.engine.begin() as conn:
        envelope = store.put_envelope(
            conn,
            tenant,
            scope,
            key,
            period=body.period,
            cap=body.cap,
            on_exceed=body.on_exceed,
            timezone=rt.settings.timezone,
            ts=run_store.now(),
        )
        store.wake_waiting(conn, tenant, run_store.now())
    rt.envelopes.changed()
    return _view(envelope)


def _delete(rt: Runtime, tenant: str, scope: str, key: str) -> Response:
    with rt.engine.begin() as conn:
        if not store.delete_envelope(conn, tenant, scope, key):
            raise NotFound(f"no {scope} envelope {key or ''}".strip())
        store.wake_waiting(conn, tenant, run_store.now())
    rt.envelopes.changed()
    return Response(status_code=204)


def _cron(rt: Runtime, tenant: str, cron_id: str) -> str:
    with reading(rt.engine) as conn:
        if schedules.get_cron(conn, cron_id, tenant) is None:
            raise NotFound(f"cron {cron_id} not found")
    return cron_id


@router.put("/v1/spend/tenant", response_model=EnvelopeView)
def put_tenant(body: EnvelopeBody, rt: RuntimeDep, caller: WriteCaller) -> EnvelopeView:
    """The tenant's own envelope: every call of its runs counts."""
    return _put(rt, caller.tenant, "tenant", "", body)


@router.delete("/v1/spend/tenant", status_code=204)
def delete_tenant(rt: RuntimeDep, caller: WriteCaller) -> Response:
    return _delete(rt, caller.tenant, "tenant", "")


@router.put("/v1/spend/agents/{name}", response_model=EnvelopeView)
def put_agent(
    name: AgentName, body: EnvelopeBody, rt: RuntimeDep, caller: WriteCaller
) -> EnvelopeView:
    """A named agent's envelope: every run of it, any version (it may be created later)."""
    return _put(rt, caller.tenant, "agent", name, body)


@router.delete("/v1/spend/agents/{name}", status_code=204)
def delete_agent(name: AgentName, rt: RuntimeDep, caller: WriteCaller) -> Response:
    return _delete(rt, caller.tenant, "agent", name)


@router.put("/v1/spend/crons/{cron_id}", response_model=EnvelopeView)
def put_cron(
    cron_id: CronId, body: EnvelopeBody, rt: RuntimeDep, caller: WriteCaller
) -> EnvelopeView:
    """A cron's envelope: every run it fires (404: not a cron of the tenant)."""
    return _put(rt, caller.tenant, "cron", _cron(rt, caller.tenant, cron_id), body)


@router.delete("/v1/spend/crons/{cron_id}", status_code=204)
def delete_cron(cron_id: CronId, rt: RuntimeDep, caller: WriteCaller) -> Response:
    return _delete(rt, caller.tenant, "cron", cron_id)
