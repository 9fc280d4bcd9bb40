"""Spend envelopes over the API (docs/cost.md): what a tenant may spend on models per day or
calendar month — its whole tenant, a named agent (any version), a cron — with what is spent
and reserved by calls in flight. Raising a cap (or removing an envelope) lets the runs that
wait for it go on at the reaper's next pass."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from fastapi import APIRouter, Path, Response
from pydantic import BaseModel, ConfigDict, Field

from scheduler.http.agents import AGENT_NAME
from scheduler.http.auth import ReadCaller, WriteCaller
from scheduler.http.deps import RuntimeDep
from shared.agent.spend import Period
from shared.engine.runtime import Runtime
from shared.errors import NotFound, SpecError
from shared.isotime import iso
from shared.store import runs as run_store
from shared.store import schedules
from shared.store import spend as store

__all__ = ["EnvelopeBody", "EnvelopeList", "EnvelopeView", "router"]

router = APIRouter(tags=["spend"])
Scope = Literal["tenant", "agent", "cron"]
TENANT_KEY = "-"  # the path key of a tenant's own envelope


class EnvelopeBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cap: float = Field(
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
    key: str
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
        key=e.key or TENANT_KEY,
        period=e.period,  # type: ignore[arg-type]
        cap=e.cap,
        on_exceed=e.on_exceed,
        spent=round(e.spent, 8),
        reserved=round(e.reserved, 8),
        left=round(max(e.left, 0.0), 8),
        period_start=iso(e.period_start),
        period_end=iso(e.period_end),
    )


KeyPath = Annotated[str, Path(min_length=1, max_length=140, pattern=r"^[A-Za-z0-9_.@-]+$")]


def _key(rt: Runtime, tenant: str, scope: Scope, key: str) -> str:
    """The stored key: "" for the tenant's own, an agent's name, a cron of the tenant."""
    if scope == "tenant":
        if key != TENANT_KEY:
            raise SpecError(f"a tenant's own envelope has the key {TENANT_KEY!r}")
        return ""
    if scope == "agent":
        if not re.match(AGENT_NAME, key):
            raise SpecError("an agent envelope's key is the agent's name (any version)")
        return key
    with rt.engine.connect() as conn:
        if schedules.get_cron(conn, key, tenant) is None:
            raise NotFound(f"cron {key} not found")
    return key


@router.get("/v1/spend", response_model=EnvelopeList)
def list_envelopes(rt: RuntimeDep, caller: ReadCaller) -> EnvelopeList:
    """The tenant's envelopes, each with what is spent and reserved in its current period."""
    with rt.engine.begin() as conn:
        store.roll(conn, caller.tenant, run_store.now(), rt.settings.timezone)
        found = store.list_envelopes(conn, caller.tenant)
    return EnvelopeList(envelopes=[_view(e) for e in found])


@router.put("/v1/spend/{scope}/{key}", response_model=EnvelopeView)
def put_envelope(
    scope: Scope, key: KeyPath, body: EnvelopeBody, rt: RuntimeDep, caller: WriteCaller
) -> EnvelopeView:
    """Create or change an envelope; the runs waiting for one of the tenant's go on."""
    stored = _key(rt, caller.tenant, scope, key)
    with rt.engine.begin() as conn:
        envelope = store.put_envelope(
            conn,
            caller.tenant,
            scope,
            stored,
            period=body.period,
            cap=body.cap,
            on_exceed=body.on_exceed,
            timezone=rt.settings.timezone,
            ts=run_store.now(),
        )
        store.wake_waiting(conn, caller.tenant, run_store.now())
    rt.envelopes.changed()
    return _view(envelope)


@router.delete("/v1/spend/{scope}/{key}", status_code=204)
def delete_envelope(scope: Scope, key: KeyPath, rt: RuntimeDep, caller: WriteCaller) -> Response:
    stored = _key(rt, caller.tenant, scope, key)
    with rt.engine.begin() as conn:
        if not store.delete_envelope(conn, caller.tenant, scope, stored):
            raise NotFound(f"no {scope} envelope {key}")
        store.wake_waiting(conn, caller.tenant, run_store.now())
    rt.envelopes.changed()
    return Response(status_code=204)
