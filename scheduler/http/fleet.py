"""Search and bulk actions over a tenant's runs (docs/api.md, "Search and bulk actions"):
``GET /v1/runs`` filters (``runs_router`` reads them with ``query_filter``) and
``POST /v1/runs/cancel``, ``/v1/runs/suspend``, ``/v1/runs/resume`` by ids or by filter,
at most 500 runs per call, each run's outcome reported."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Final

from fastapi import Body, Request
from pydantic import (
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema
from starlette.datastructures import QueryParams

from scheduler.http.agents import AGENT_NAME
from scheduler.http.auth import WriteCaller
from scheduler.http.deps import RuntimeDep
from scheduler.http.routing import api_router
from scheduler.http.schemas import ID_PATTERN, JsonInt, RunStatus
from shared.engine import fleet
from shared.engine.runtime import Runtime
from shared.errors import SpecError
from shared.store.runs import RunFilter

__all__ = ["MAX_META_FILTERS", "IsoTime", "query_filter", "router", "searchable"]

MAX_META_FILTERS: Final = 8
META_KEY = r"^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,63}$"
_META_KEY = re.compile(META_KEY)
_META_PREFIX = "metadata."
MetaKey = Annotated[str, StringConstraints(pattern=META_KEY)]
MetaValue = Annotated[str, StringConstraints(max_length=256, pattern=r"^[^\x00]*$")]
RunIdStr = Annotated[str, StringConstraints(pattern=ID_PATTERN)]
AgentNameStr = Annotated[str, StringConstraints(pattern=AGENT_NAME)]


_ISO = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}")


def _iso(value: object) -> object:
    """A date-time as the schema means it: an ISO 8601 string (pydantic would take a number,
    or a string of one, as epoch seconds)."""
    if not isinstance(value, str) or not _ISO.match(value):
        raise ValueError("Input should be an ISO 8601 date-time with an offset")
    return value


IsoTime = Annotated[AwareDatetime, BeforeValidator(_iso)]
"""A ``date-time`` string with its offset, in a query or a body."""


def _ts(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def searchable(key: str, value: object) -> bool:
    """A metadata pair the store can select by (a plain key, a string without NUL)."""
    return bool(_META_KEY.match(key)) and isinstance(value, str) and "\x00" not in value


def meta_filters(params: QueryParams) -> dict[str, str]:
    """The ``metadata.<key>=<value>`` query parameters (each key once, at most 8)."""
    found: dict[str, str] = {}
    for name, value in params.multi_items():
        if not name.startswith("metadata"):
            continue
        key = name.removeprefix(_META_PREFIX)
        if not name.startswith(_META_PREFIX) or not _META_KEY.match(key):
            raise SpecError(f"invalid metadata filter {name[:80]!r}: metadata.<key>=<value>")
        if key in found or len(value) > 256 or "\x00" in value:
            raise SpecError(f"metadata filter {key!r}: one value of at most 256 characters")
        found[key] = value
    if len(found) > MAX_META_FILTERS:
        raise SpecError(f"at most {MAX_META_FILTERS} metadata filters")
    return found


def query_filter(
    request: Request,
    *,
    agent: str | None,
    status: list[str] | None,
    thread_id: str | None,
    created: tuple[datetime | None, datetime | None],
    ended: tuple[datetime | None, datetime | None],
) -> RunFilter:
    """``GET /v1/runs``'s query as a ``RunFilter``."""
    return RunFilter(
        metadata=meta_filters(request.query_params),
        agent=agent,
        statuses=tuple(dict.fromkeys(status or ())),
        thread_id=thread_id,
        created_after=_ts(created[0]),
        created_before=_ts(created[1]),
        ended_after=_ts(ended[0]),
        ended_before=_ts(ended[1]),
    )


MetaFilter = Annotated[
    dict[MetaKey, MetaValue],
    Field(
        min_length=1,
        max_length=MAX_META_FILTERS,
        json_schema_extra={"additionalProperties": False},  # keys: the pattern's only
    ),
]
StatusList = Annotated[list[RunStatus], Field(min_length=1, max_length=7)]


class BulkFilter(BaseModel):
    """Which runs: every part given must hold; at least one part, none empty or null (the
    schema says so: ``minProperties``, no nulls, non-empty ``metadata`` and ``status``)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"minProperties": 1})
    metadata: MetaFilter | SkipJsonSchema[None] = Field(
        default=None, description="Exact string values"
    )
    agent: AgentNameStr | SkipJsonSchema[None] = None
    status: StatusList | SkipJsonSchema[None] = None
    thread_id: RunIdStr | SkipJsonSchema[None] = None
    created_after: IsoTime | SkipJsonSchema[None] = None
    created_before: IsoTime | SkipJsonSchema[None] = None
    ended_after: IsoTime | SkipJsonSchema[None] = None
    ended_before: IsoTime | SkipJsonSchema[None] = None

    @model_validator(mode="before")
    @classmethod
    def _no_nulls(cls, data: Any) -> Any:
        if isinstance(data, dict) and any(v is None for v in data.values()):
            raise ValueError("a filter's parts are not null: leave a part out instead")
        return data

    @model_validator(mode="after")
    def _some(self) -> BulkFilter:
        if not any(v is not None for v in self.model_dump().values()):
            raise ValueError("an empty filter: name at least one of its parts")
        return self

    def run_filter(self) -> RunFilter:
        return RunFilter(
            metadata=self.metadata or {},
            agent=self.agent,
            statuses=tuple(dict.fromkeys(self.status or ())),
            thread_id=self.thread_id,
            created_after=_ts(self.created_after),
            created_before=_ts(self.created_before),
            ended_after=_ts(self.ended_after),
            ended_before=_ts(self.ended_before),
        )


class ByIds(BaseModel):
    """The runs named (1-500 ids; one named twice is acted on once)."""

    model_config = ConfigDict(extra="forbid")
    ids: list[RunIdStr] = Field(min_length=1, max_length=fleet.MAX_BULK)


class ByFilter(BaseModel):
    """The runs a filter matches that the action applies to, oldest first, at most
    ``limit`` (``more`` in the answer says whether more match)."""

    model_config = ConfigDict(extra="forbid")
    filter: BulkFilter
    limit: JsonInt = Field(default=100, ge=1, le=fleet.MAX_BULK)


BulkBody = Annotated[ByIds | ByFilter, Body()]
"""``{"ids": [...]}`` or ``{"filter": {...}, "limit"?}``, not both."""


class BulkOutcome(BaseModel):
    run_id: str
    outcome: str = Field(
        description="cancelled | suspended | suspending | resumed | not_found | skipped"
    )
    status: str | None = None
    detail: str | None = None


class BulkResult(BaseModel):
    results: list[BulkOutcome]
    more: bool = Field(description="A filter matched more runs than `limit`: call again")


def _bulk(rt: Runtime, tenant: str, action: str, body: ByIds | ByFilter) -> BulkResult:
    more = False
    if isinstance(body, ByFilter):
        ids, more = fleet.select_runs(rt, tenant, action, body.filter.run_filter(), body.limit)
    else:
        ids = list(body.ids)
    done = fleet.bulk(rt, tenant, action, ids)
    return BulkResult(
        results=[
            BulkOutcome(run_id=o.run_id, outcome=o.outcome, status=o.status, detail=o.detail)
            for o in done
        ],
        more=more,
    )


router = api_router(prefix="/v1", tags=["runs"])


@router.post("/runs/cancel", response_model=BulkResult)
def cancel_many(body: BulkBody, rt: RuntimeDep, caller: WriteCaller) -> BulkResult:
    """Cancel runs by ids or by filter (a filter selects those not ended)."""
    return _bulk(rt, caller.tenant, "cancel", body)


@router.post("/runs/suspend", response_model=BulkResult)
def suspend_many(body: BulkBody, rt: RuntimeDep, caller: WriteCaller) -> BulkResult:
    """Suspend live top-level runs at their next round boundary (``pending.kind``
    ``suspended``, holding nothing)."""
    return _bulk(rt, caller.tenant, "suspend", body)


@router.post("/runs/resume", response_model=BulkResult)
def resume_many(body: BulkBody, rt: RuntimeDep, caller: WriteCaller) -> BulkResult:
    """Resume suspended runs (their next round is queued)."""
    return _bulk(rt, caller.tenant, "resume", body)
