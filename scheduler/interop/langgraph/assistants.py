"""LangGraph assistants over treadle's agents (docs/api.md, "LangGraph assistants").

An assistant is a named agent: ``assistant_id`` is the agent's name. A registered agent is an
assistant of its own graph (version 1, read-only). ``assistants.create(graph_id, context=...)``
makes a tenant's agent whose spec is the ``graph_id`` agent's spec with the ``context`` fields
over it (and the spec fields found in ``config["configurable"]``); ``update`` adds a version
(the same, over the latest version or a new ``graph_id``), ``get_versions`` lists them, and a
run names a version as ``"<assistant_id>@<version>"``. ``set_latest`` (a rollback) points the
agent's ``latest`` tag at a version: the bare name resolves to it until a new version is
added; ``delete`` deletes the agent (``DELETE /v1/agents/{name}``).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Annotated, Any

from fastapi import Body, Depends, Path, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from scheduler.http.agent_routes import add_agent_version, delete_agent, tag_version
from scheduler.http.agents import (
    AGENT_NAME,
    BUILTIN_AGENTS,
    agent_names,
    is_registered,
    parse_ref,
    registered_agents,
)
from scheduler.http.auth import Caller, ReadCaller, WriteCaller
from scheduler.http.deps import RuntimeDep
from scheduler.http.routing import api_router
from scheduler.http.schemas import JsonInt
from shared.agent.spec import AgentSpec
from shared.engine.runtime import Runtime
from shared.errors import Conflict, NotFound
from shared.isotime import iso
from shared.store import agents as store
from shared.store.agents import AgentVersion
from shared.store.db import reading

__all__ = ["Assistants", "router"]

_SPEC_FIELDS = frozenset(AgentSpec.model_fields)
_SEARCH_MAX = 1000


# an assistant as a path parameter: an agent's name, maybe with "@<version>" (422 past it)
AssistantId = Annotated[
    str,
    Path(min_length=1, max_length=74, pattern=r"^[^@\x00-\x1f\x7f]{1,64}(@[0-9]{1,9})?$"),
]
GraphId = Annotated[str, Field(min_length=1, max_length=74)]


class AssistantBody(BaseModel):
    """``POST /assistants`` and ``PATCH /assistants/{id}``; unknown keys are ignored."""

    model_config = ConfigDict(extra="ignore")

    graph_id: GraphId | None = None
    config: dict[str, Any] | None = None
    context: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    assistant_id: str | None = Field(default=None, pattern=AGENT_NAME)
    if_exists: str | None = Field(default=None, max_length=32)
    name: str | None = Field(default=None, max_length=200)
    description: str | None = Field(default=None, max_length=2000)


class LatestBody(BaseModel):
    """``POST /assistants/{id}/latest``: the version the assistant resolves to from now on."""

    model_config = ConfigDict(extra="ignore")

    version: JsonInt = Field(ge=1, le=999_999_999)


class AssistantPage(BaseModel):
    """``POST /assistants/search`` and ``/assistants/{id}/versions``: a page of matches."""

    model_config = ConfigDict(extra="ignore")

    graph_id: str | None = Field(default=None, max_length=200)
    name: str | None = Field(default=None, max_length=200)
    metadata: dict[str, Any] | None = None
    limit: JsonInt = Field(default=10, ge=1, le=1000)
    offset: JsonInt = Field(default=0, ge=0, le=1_000_000)


def _registered_view(name: str) -> dict[str, Any]:
    return {
        "assistant_id": name,
        "graph_id": name,
        "name": name,
        "config": {},
        "context": {},
        "metadata": {"builtin": name in BUILTIN_AGENTS},
        "version": 1,
        "created_at": iso(0),
        "updated_at": iso(0),
        "description": None,
    }


def _version_view(v: AgentVersion) -> dict[str, Any]:
    made = v.facade or {}
    return {
        "assistant_id": v.name,
        "graph_id": made.get("graph_id") or v.name,
        "name": made.get("name") or v.name,
        "config": made.get("config") or {},
        "context": made.get("context") or {},
        "metadata": v.meta or {},
        "version": v.version,
        "created_at": iso(v.created_at),
        "updated_at": iso(v.created_at),
        "description": v.description,
    }


def _overrides(body: AssistantBody) -> dict[str, Any]:
    """The spec fields an assistant sets: ``config.configurable`` (spec fields only), then
    ``context`` (all of it: an unknown field is a 422)."""
    configurable = (body.config or {}).get("configurable") or {}
    picked = {k: v for k, v in configurable.items() if k in _SPEC_FIELDS}
    return {**picked, **(body.context or {})}


def _assistant_spec(base: dict[str, Any], body: AssistantBody) -> AgentSpec:
    """The spec ``body`` makes of ``base``; an invalid field is named where the client set it
    (``context.max_rounds``, ``config.configurable.model``), not as a spec field."""
    try:
        return AgentSpec.model_validate({**base, **_overrides(body)})
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *_set_in(body, e["loc"]), *e["loc"])} for e in exc.errors()]
        raise RequestValidationError(errors, body=body.model_dump(mode="json")) from exc


def _set_in(body: AssistantBody, loc: tuple[Any, ...]) -> tuple[str, ...]:
    """Where the body set the spec field ``loc`` starts with (the graph's own spec: its id)."""
    field = loc[0] if loc else None
    if field is None:
        return ()
    if field in (body.context or {}):
        return ("context",)
    if field in ((body.config or {}).get("configurable") or {}):
        return ("config", "configurable")
    return ("graph_id",)


def _spec_of(rt: Runtime, tenant: str, graph_id: str) -> dict[str, Any]:
    """The raw spec of the agent a ``graph_id`` names."""
    name, version = parse_ref(graph_id)
    if is_registered(name) and version is None:
        return dict(registered_agents()[name])
    with reading(rt.engine) as conn:
        found = store.get_version(conn, tenant, name, version)
    if found is None:
        raise NotFound(f"no graph (agent) named {graph_id!r}")
    return dict(found.spec)


def _latest(rt: Runtime, tenant: str, name: str) -> AgentVersion | None:
    with reading(rt.engine) as conn:
        return store.get_version(conn, tenant, name)


def _matches(view: Mapping[str, Any], body: Mapping[str, Any]) -> bool:
    if body.get("graph_id") and view["graph_id"] != body["graph_id"]:
        return False
    name = str(body.get("name") or "").lower()
    if name and name not in str(view["name"]).lower():
        return False
    wanted = body.get("metadata") or {}
    return all(view["metadata"].get(k) == v for k, v in wanted.items())


class _Assistants:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt

    def create(self, caller: Caller, body: AssistantBody) -> dict[str, Any]:
        rt, tenant = self.rt, caller.tenant
        name = body.assistant_id or str(uuid.uuid4())
        known = _latest(rt, tenant, name)
        if (known is not None or is_registered(name)) and body.if_exists == "do_nothing":
            return _version_view(known) if known is not None else _registered_view(name)
        base = _spec_of(rt, tenant, body.graph_id) if body.graph_id else {}
        spec = _assistant_spec(base, body)
        made = add_agent_version(
            rt,
            caller,
            name,
            spec,
            new=True,
            description=body.description,
            meta=body.metadata,
            facade=self._facade(body),
        )
        return _version_view(made)

    def update(self, caller: Caller, assistant_id: str, body: AssistantBody) -> dict[str, Any]:
        rt, tenant = self.rt, caller.tenant
        if is_registered(assistant_id):
            raise Conflict(f"assistant {assistant_id!r} is registered by the operator: read-only")
        latest = _latest(rt, tenant, assistant_id)
        if latest is None:
            raise NotFound(f"assistant {assistant_id!r} not found")
        made = latest.facade or {}
        base = _spec_of(rt, tenant, body.graph_id) if body.graph_id else latest.spec
        spec = _assistant_spec(base, body)
        facade = {
            "graph_id": body.graph_id or made.get("graph_id"),
            "config": body.config if body.config is not None else made.get("config"),
            "context": body.context if body.context is not None else made.get("context"),
            "name": body.name or made.get("name"),
        }
        new = add_agent_version(
            rt,
            caller,
            assistant_id,
            spec,
            new=False,
            description=body.description or latest.description,
            meta={**(latest.meta or {}), **(body.metadata or {})},
            facade=facade,
        )
        return _version_view(new)

    @staticmethod
    def _facade(body: AssistantBody) -> dict[str, Any]:
        return {
            "graph_id": body.graph_id,
            "config": body.config,
            "context": body.context,
            "name": body.name,
        }

    def get(self, tenant: str, assistant_id: str) -> dict[str, Any]:
        name, version = parse_ref(assistant_id)
        if is_registered(name) and version is None:
            return _registered_view(name)
        with reading(self.rt.engine) as conn:
            found = store.get_version(conn, tenant, name, version)
        if found is None:
            raise NotFound(f"assistant {assistant_id!r} not found")
        return _version_view(found)

    def versions(self, tenant: str, assistant_id: str, body: AssistantPage) -> list[Any]:
        limit, offset = body.limit, body.offset
        if is_registered(assistant_id):
            views = [_registered_view(assistant_id)]
        else:
            with reading(self.rt.engine) as conn:
                found = store.list_versions(conn, tenant, assistant_id, limit=_SEARCH_MAX)
            if not found:
                raise NotFound(f"assistant {assistant_id!r} not found")
            views = [_version_view(v) for v in found]
        views = [v for v in views if _matches(v, {"metadata": body.metadata})]
        return views[offset : offset + limit]

    def search(self, tenant: str, body: AssistantPage) -> list[dict[str, Any]]:
        with reading(self.rt.engine) as conn:
            own = store.latest_versions(conn, tenant, limit=_SEARCH_MAX)
        views = [_registered_view(n) for n in agent_names()] + [_version_view(v) for v in own]
        found = [v for v in views if _matches(v, body.model_dump())]
        return found[body.offset : body.offset + body.limit]


def _assistants(rt: RuntimeDep) -> _Assistants:
    return _Assistants(rt)


Assistants = Annotated[_Assistants, Depends(_assistants)]
"""A route's assistants, over the request's runtime."""

router = api_router()
"""The assistants routes of the LangGraph facade (``scheduler.interop.langgraph.routes`` includes
them)."""


@router.post("/assistants")
def create_assistant(body: AssistantBody, a: Assistants, caller: WriteCaller) -> dict[str, Any]:
    return a.create(caller, body)


@router.patch("/assistants/{assistant_id}")
def update_assistant(
    assistant_id: AssistantId, body: AssistantBody, a: Assistants, caller: WriteCaller
) -> dict[str, Any]:
    return a.update(caller, assistant_id, body)


@router.get("/assistants/{assistant_id}")
def get_assistant(assistant_id: AssistantId, a: Assistants, caller: ReadCaller) -> dict[str, Any]:
    return a.get(caller.tenant, assistant_id)


@router.delete("/assistants/{assistant_id}", status_code=204, response_class=Response)
def delete_assistant(assistant_id: AssistantId, rt: RuntimeDep, caller: WriteCaller) -> Response:
    if parse_ref(assistant_id)[1] is not None:
        raise Conflict("delete an assistant by its id, not one of its versions")
    delete_agent(rt, caller.tenant, assistant_id)
    return Response(status_code=204)


@router.post("/assistants/{assistant_id}/latest")
def set_latest(
    assistant_id: AssistantId, body: LatestBody, a: Assistants, caller: WriteCaller
) -> dict[str, Any]:
    if parse_ref(assistant_id)[1] is not None:
        raise Conflict("set the latest version of an assistant by its id")
    tag_version(a.rt, caller.tenant, assistant_id, store.LATEST_TAG, body.version)
    return a.get(caller.tenant, assistant_id)


@router.post("/assistants/{assistant_id}/versions")
def assistant_versions(
    assistant_id: AssistantId,
    a: Assistants,
    caller: ReadCaller,
    body: Annotated[AssistantPage | None, Body()] = None,
) -> list[Any]:
    return a.versions(caller.tenant, assistant_id, body or AssistantPage())


@router.post("/assistants/search")
def search_assistants(
    a: Assistants, caller: ReadCaller, body: Annotated[AssistantPage | None, Body()] = None
) -> list[dict[str, Any]]:
    return a.search(caller.tenant, body or AssistantPage())
