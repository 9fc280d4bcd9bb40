"""Agents over the API (docs/api.md, "Agents"): a tenant creates an agent (``POST
/v1/agents``), adds immutable versions (``PUT /v1/agents/{name}``), reads one
(``GET /v1/agents/{name}``, ``name@3`` for a version, ``name@prod`` for a tag) and lists its
versions, tags versions (``PUT /v1/agents/{name}/tags/{tag}``: made or moved, a rollback) and
deletes the agent (``DELETE /v1/agents/{name}``: its runs keep the spec they started with); a
run names it (``agent: "name"`` for the latest, ``"name@3"``, ``"name@prod"``). A spec is
checked as a run's is, before anything is written. Registered agents (built-ins,
``TREADLE_AGENTS_FILE``) read the same and are read-only (409)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Path, Query, Response
from pydantic import BaseModel, ConfigDict, Field

from scheduler.http import limits
from scheduler.http.agents import (
    AGENT_NAME,
    is_registered,
    parse_ref,
    registered_agents,
    resolve,
    store_lookup,
)
from scheduler.http.auth import Caller, ReadCaller, WriteCaller
from scheduler.http.deps import RuntimeDep
from scheduler.http.routing import api_router
from scheduler.http.schemas import JsonInt
from shared.agent.spec import AgentSpec
from shared.engine.catalog import build_catalog
from shared.engine.knowledge import check_sources
from shared.engine.runtime import Runtime
from shared.errors import Conflict, NotFound
from shared.isotime import iso
from shared.store import agents as store
from shared.store import runs as run_store
from shared.store.agents import AgentVersion
from shared.store.db import reading

__all__ = [
    "AgentBody",
    "AgentView",
    "add_agent_version",
    "check_agent_spec",
    "delete_agent",
    "read_agent",
    "router",
    "tag_version",
]

AgentName = Annotated[str, Field(pattern=AGENT_NAME, description="[A-Za-z0-9][A-Za-z0-9_.-]*")]
AgentRef = Annotated[
    str,
    Path(
        max_length=100,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}(@([0-9]{1,9}|[a-z][a-z0-9_-]{0,31}))?$",
    ),
]
AgentNamePath = Annotated[str, Path(pattern=AGENT_NAME)]
TagPath = Annotated[str, Path(pattern=store.TAG, description="[a-z][a-z0-9_-]*, e.g. prod")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AgentBody(_Strict):
    """``PUT /v1/agents/{name}``: the new version."""

    spec: AgentSpec
    description: str | None = Field(default=None, max_length=2000)
    metadata: dict[str, Any] | None = None


class AgentCreate(AgentBody):
    """``POST /v1/agents``: the agent's name and its first version."""

    name: AgentName


class AgentView(BaseModel):
    name: str
    version: int | None = Field(description="None for a registered (file) agent")
    ref: str = Field(description="What a run names for exactly this version")
    source: Literal["api", "registered"]
    read_only: bool
    spec: dict[str, Any]
    description: str | None = None
    metadata: dict[str, Any] | None = None
    created_at: str | None = None
    tags: list[str] = Field(default_factory=list, description="The tags on this version")


class AgentVersionList(BaseModel):
    versions: list[AgentView]


class TagBody(_Strict):
    """``PUT /v1/agents/{name}/tags/{tag}``: the version the tag points at from now on."""

    version: JsonInt = Field(ge=1, le=999_999_999)


class TagList(BaseModel):
    tags: dict[str, int] = Field(description="Each tag and the version it points at")


def version_view(v: AgentVersion, tags: list[str] | None = None) -> AgentView:
    return AgentView(
        tags=tags or [],
        name=v.name,
        version=v.version,
        ref=v.ref,
        source="api",
        read_only=False,
        spec=v.spec,
        description=v.description,
        metadata=v.meta,
        created_at=iso(v.created_at),
    )


def _registered_view(name: str) -> AgentView:
    spec = registered_agents()[name]
    return AgentView(
        name=name, version=None, ref=name, source="registered", read_only=True, spec=spec
    )


def check_agent_spec(rt: Runtime, caller: Caller, spec: AgentSpec) -> None:
    """The checks a run's spec gets at submit, before anything is written: sizes (413), what
    a tenant may reach (422), agents named by its tools, known tools, existing datasets."""
    limits.check_size(rt.settings, spec, "")
    limits.police_spec(rt, caller, spec)
    resolved = resolve(spec, store_lookup(rt, caller.tenant)).spec
    build_catalog(resolved)  # unknown tools, bad inline tools: SpecError
    check_sources(rt, caller.tenant, resolved, {})


def add_agent_version(
    rt: Runtime,
    caller: Caller,
    name: str,
    spec: AgentSpec,
    *,
    new: bool,
    description: str | None = None,
    meta: dict[str, Any] | None = None,
    facade: dict[str, Any] | None = None,
) -> AgentVersion:
    """The agent's first (``new``) or next version, after the checks, within the tenant's
    quotas (``TREADLE_MAX_AGENTS``, ``TREADLE_MAX_AGENT_VERSIONS``: 403 past them)."""
    _writable(name)
    check_agent_spec(rt, caller, spec)
    quota = store.Quota(rt.settings.max_agents, rt.settings.max_agent_versions)
    with rt.engine.begin() as conn:
        return store.add_version(
            conn,
            caller.tenant,
            name,
            spec.model_dump(mode="json", exclude_none=True),
            run_store.now(),
            new=new,
            description=description,
            meta=meta,
            facade=facade,
            quota=quota,
        )


def read_agent(rt: Runtime, tenant: str, ref: str) -> AgentView:
    """A registered agent, or a version of the tenant's (``name@3``; the latest without)."""
    name, version = parse_ref(ref)
    if is_registered(name) and version is None:
        return _registered_view(name)
    with reading(rt.engine) as conn:
        found = store.get_version(conn, tenant, name, version)
        tags = store.tags_by_version(conn, tenant, name)
    if found is None:
        raise NotFound(f"agent {ref!r} not found")
    return version_view(found, tags.get(found.version))


def _writable(name: str) -> None:
    if is_registered(name):
        raise Conflict(f"agent {name!r} is registered by the operator and read-only")


def delete_agent(rt: Runtime, tenant: str, name: str) -> None:
    """Delete the tenant's agent: every version and tag (its runs keep their specs)."""
    _writable(name)
    with rt.engine.begin() as conn:
        if not store.delete_agent(conn, tenant, name):
            raise NotFound(f"agent {name!r} not found")


def tag_version(rt: Runtime, tenant: str, name: str, tag: str, version: int) -> AgentView:
    """Point ``tag`` at ``version`` (a rollback when it moves back)."""
    _writable(name)
    with rt.engine.begin() as conn:
        found = store.set_tag(conn, tenant, name, tag, version, run_store.now())
        tags = store.tags_by_version(conn, tenant, name)
    return version_view(found, tags.get(found.version))


router = api_router(prefix="/v1", tags=["agents"])


@router.post("/agents", status_code=201, response_model=AgentView)
def create(body: AgentCreate, rt: RuntimeDep, caller: WriteCaller) -> AgentView:
    """Create an agent: its version 1 (409 if the name is taken)."""
    return _added(rt, caller, body.name, body, new=True)


@router.put("/agents/{name}", response_model=AgentView)
def update(name: AgentRef, body: AgentBody, rt: RuntimeDep, caller: WriteCaller) -> AgentView:
    """A new immutable version of the agent; runs naming it without a version get it."""
    if parse_ref(name)[1] is not None:
        raise Conflict("versions are immutable: PUT the agent's name to add one")
    return _added(rt, caller, name, body, new=False)


def _added(rt: Runtime, caller: Caller, name: str, body: AgentBody, *, new: bool) -> AgentView:
    """The version ``body`` adds (the agent's first when ``new``), as the API shows it."""
    desc, meta = body.description, body.metadata
    return version_view(
        add_agent_version(rt, caller, name, body.spec, new=new, description=desc, meta=meta)
    )


@router.get("/agents/{name}", response_model=AgentView)
def get(name: AgentRef, rt: RuntimeDep, caller: ReadCaller) -> AgentView:
    """The agent's latest version, or ``name@3``; a registered agent (read-only)."""
    return read_agent(rt, caller.tenant, name)


@router.get("/agents/{name}/versions", response_model=AgentVersionList)
def versions(
    name: AgentRef,
    rt: RuntimeDep,
    caller: ReadCaller,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
) -> AgentVersionList:
    """The agent's versions, newest first (a registered agent: itself, unversioned)."""
    if is_registered(name):
        return AgentVersionList(versions=[_registered_view(name)][offset : offset + limit])
    with reading(rt.engine) as conn:
        found = store.list_versions(conn, caller.tenant, name, limit=limit, offset=offset)
        tags = store.tags_by_version(conn, caller.tenant, name)
    if not found and offset == 0:
        raise NotFound(f"agent {name!r} not found")
    return AgentVersionList(versions=[version_view(v, tags.get(v.version)) for v in found])


@router.delete("/agents/{name}", status_code=204, response_class=Response)
def delete(name: AgentNamePath, rt: RuntimeDep, caller: WriteCaller) -> Response:
    """Delete the agent: every version and tag. Runs that named it keep the spec they
    started with; new runs naming it get 404."""
    delete_agent(rt, caller.tenant, name)
    return Response(status_code=204)


@router.get("/agents/{name}/tags", response_model=TagList)
def tags(name: AgentNamePath, rt: RuntimeDep, caller: ReadCaller) -> TagList:
    """The agent's tags and the version each points at."""
    with reading(rt.engine) as conn:
        by_version = store.tags_by_version(conn, caller.tenant, name)
        if not by_version and store.get_version(conn, caller.tenant, name) is None:
            raise NotFound(f"agent {name!r} not found")
    return TagList(tags={t: v for v, ts in sorted(by_version.items()) for t in ts})


@router.put("/agents/{name}/tags/{tag}", response_model=AgentView)
def put_tag(
    name: AgentNamePath, tag: TagPath, body: TagBody, rt: RuntimeDep, caller: WriteCaller
) -> AgentView:
    """Point the tag at a version (made, or moved: a rollback). ``latest`` is what the
    bare name resolves to until the next version is added."""
    return tag_version(rt, caller.tenant, name, tag, body.version)


@router.delete("/agents/{name}/tags/{tag}", status_code=204, response_class=Response)
def delete_tag(name: AgentNamePath, tag: TagPath, rt: RuntimeDep, caller: WriteCaller) -> Response:
    """Remove the tag (404 when it is not set)."""
    _writable(name)
    with rt.engine.begin() as conn:
        if not store.drop_tag(conn, caller.tenant, name, tag):
            raise NotFound(f"agent {name!r} has no tag {tag!r}")
    return Response(status_code=204)
