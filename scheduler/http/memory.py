"""Long-term memory over HTTP (docs/memory.md): ``/v1/memory/...``, a tenant's items
``(namespace, key) → JSON value``.

* ``PUT /v1/memory/items`` writes (replaces) an item; ``GET`` reads one
  (``?namespace=a.b&key=k``), ``DELETE`` deletes one;
* ``POST /v1/memory/search``: under a namespace prefix, by a filter, by a query (keywords,
  and vector similarity when an embeddings profile is configured);
* ``POST /v1/memory/namespaces`` lists namespaces; ``DELETE /v1/memory?prefix=a.b`` deletes a
  namespace and everything below it (``?prefix=*``: all of the tenant's memory);
* ``GET /v1/runs/{id}/memory``: a run's reads and writes of memory (its ``memory.*`` events).

Namespaces travel as lists of labels in bodies and as labels joined by ``.`` in a query
string (a label has no ``.``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Depends, Query, Response
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from scheduler.http.auth import ReadCaller, WriteCaller
from scheduler.http.deps import RuntimeDep
from scheduler.http.routing import api_router
from scheduler.http.schemas import NUMBER, JsonInt, PathId, TtlSeconds
from shared.agent.memory import KEY_CHARS, NAMESPACE_DEPTH, OPERATORS, check_filter, split_namespace
from shared.engine import memory
from shared.engine.runtime import Runtime
from shared.errors import NotFound
from shared.isotime import iso, iso_or_none, iso_times
from shared.store import records
from shared.store import runs as run_store
from shared.store.db import reading
from shared.store.memory import MemoryItem
from shared.vocab import MEMORY_EVENTS

__all__ = [
    "Depth",
    "DottedNamespace",
    "Filter",
    "Flag",
    "Index",
    "ItemAt",
    "ItemQuery",
    "ItemView",
    "Key",
    "Namespace",
    "QueryKey",
    "dotted",
    "item_view",
    "listed",
    "router",
    "searched",
]

router = api_router(prefix="/v1", tags=["memory"])

# The schema states each limit's ceiling; a setting (TREADLE_MEMORY_MAX_*) may lower it.
_LABEL = r"[^.\x00-\x1f\x7f]{1,64}"
DOTTED = f"^{_LABEL}(\\.{_LABEL}){{0,{NAMESPACE_DEPTH - 1}}}$"
Label = Annotated[str, Field(min_length=1, max_length=64, pattern=f"^{_LABEL}$")]
Namespace = Annotated[list[Label], Field(max_length=NAMESPACE_DEPTH)]
Key = Annotated[str, Field(min_length=1, max_length=KEY_CHARS, pattern=r"^[^\x00-\x1f\x7f]+$")]
DottedNamespace = Annotated[str, Query(max_length=600, pattern=DOTTED, description="a.b.c")]
QueryKey = Annotated[str, Query(min_length=1, max_length=KEY_CHARS, pattern=r"^[^\x00-\x1f\x7f]+$")]


class ItemQuery:
    """What a GET of one item says in its query string (``?namespace=a.b&key=k``, and
    ``refresh_ttl``: the read starts the item's ttl again); this API's and the LangGraph
    Store's."""

    def __init__(
        self, namespace: DottedNamespace, key: QueryKey, refresh_ttl: bool | None = None
    ) -> None:
        self.namespace, self.key, self.refresh_ttl = namespace, key, refresh_ttl

    def read(self, rt: Runtime, tenant: str) -> MemoryItem | None:
        """The item; None when there is none, or it expired."""
        return memory.get_item(
            rt, tenant, dotted(self.namespace), self.key, refresh=self.refresh_ttl
        )


ItemAt = Annotated[ItemQuery, Depends()]


def _bool(value: Any) -> Any:
    if not isinstance(value, bool):
        raise ValueError("Input should be a boolean")
    return value


Flag = Annotated[bool, BeforeValidator(_bool)]
Depth = Annotated[int, Field(ge=1, le=NAMESPACE_DEPTH), NUMBER]
"""A ``boolean`` as JSON Schema means it: true or false, not 1 or "yes"."""
Index = (
    Annotated[Literal[False], BeforeValidator(_bool)]
    | Annotated[list[Annotated[str, Field(max_length=200)]], Field(max_length=32)]
    | None
)
_OPERATORS = sorted(OPERATORS)
_FILTER_VALUE = {
    "anyOf": [
        {"not": {"type": "object"}},
        {"type": "object", "propertyNames": {"not": {"pattern": "^\\$"}}},
        {
            "type": "object",
            "minProperties": 1,
            "propertyNames": {"enum": _OPERATORS},
            "properties": {"$in": {"type": "array"}, "$nin": {"type": "array"}},
        },
    ]
}


def _filter(value: dict[str, Any] | None) -> dict[str, Any] | None:
    check_filter(value)  # ValueError: a 422
    return value


Filter = Annotated[
    dict[str, Any] | None,
    AfterValidator(_filter),
    Field(
        description="{field: value} (equality) or {field: {$op: value}}: " + " ".join(_OPERATORS),
        json_schema_extra={"additionalProperties": _FILTER_VALUE},
    ),
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MemoryPut(_Strict):
    namespace: Namespace = Field(min_length=1)
    key: Key
    value: dict[str, Any]
    ttl_s: TtlSeconds | None = Field(default=None, description="Expire this long after writing")
    index: Index = Field(
        default=None,
        description="What search reads: null = the whole value, a list of field paths, or "
        "false (not searchable by query)",
    )


class MemorySearch(_Strict):
    namespace_prefix: Namespace = Field(default_factory=list)
    query: str | None = Field(default=None, max_length=2000)
    filter: Filter = None
    limit: JsonInt = Field(default=10, ge=1, le=1000)
    offset: JsonInt = Field(default=0, ge=0, le=100_000)
    refresh_ttl: Flag | None = None


class MemoryNamespaces(_Strict):
    prefix: Namespace | None = Field(default_factory=list)
    suffix: Namespace | None = Field(default_factory=list)
    max_depth: Depth | None = None
    limit: JsonInt = Field(default=100, ge=1, le=1000)
    offset: JsonInt = Field(default=0, ge=0, le=100_000)


class ItemView(BaseModel):
    namespace: list[str]
    key: str
    value: dict[str, Any]
    created_at: str
    updated_at: str
    expires_at: str | None = None
    ttl_s: float | None = None
    run_id: str | None = Field(default=None, description="The run that wrote it, if a run did")
    score: float | None = None


class ItemList(BaseModel):
    items: list[ItemView]


class NamespaceList(BaseModel):
    namespaces: list[list[str]]


class Deleted(BaseModel):
    deleted: int


class MemoryEvent(BaseModel):
    seq: int
    type: str
    data: dict[str, Any]
    ts: str


class MemoryEvents(BaseModel):
    events: list[MemoryEvent]


def item_view(item: MemoryItem, score: float | None = None) -> ItemView:
    return ItemView(
        namespace=list(item.namespace),
        key=item.key,
        value=item.value,
        created_at=iso(item.created_at),
        updated_at=iso(item.updated_at),
        expires_at=iso_or_none(item.expires_at),
        ttl_s=item.ttl_s,
        run_id=item.run_id,
        score=score,
    )


def dotted(namespace: str) -> list[str]:
    """A query string's namespace (labels joined by ``.``) as its labels."""
    return split_namespace(namespace)


@router.put("/memory/items", response_model=ItemView)
def put_item(body: MemoryPut, rt: RuntimeDep, caller: WriteCaller) -> ItemView:
    """Write an item (a new one, or replace the value under that namespace and key)."""
    item = memory.put_item(
        rt, caller.tenant, body.namespace, body.key, body.value, ttl_s=body.ttl_s, index=body.index
    )
    return item_view(item)


@router.get("/memory/items", response_model=ItemView)
def get_item(rt: RuntimeDep, caller: ReadCaller, at: ItemAt) -> ItemView:
    """One item (404 when there is none, or it expired)."""
    item = at.read(rt, caller.tenant)
    if item is None:
        raise NotFound(f"no memory item {at.key!r} in {at.namespace!r}")
    return item_view(item)


@router.delete("/memory/items", status_code=204, response_class=Response)
def delete_item(
    rt: RuntimeDep,
    caller: WriteCaller,
    namespace: DottedNamespace,
    key: QueryKey,
) -> Response:
    if not memory.delete_item(rt, caller.tenant, dotted(namespace), key):
        raise NotFound(f"no memory item {key!r} in {namespace!r}")
    return Response(status_code=204)


def searched(rt: Runtime, tenant: str, body: MemorySearch) -> list[memory.Hit]:
    """A search body's items (this API's, or the LangGraph Store's)."""
    return memory.search(
        rt,
        tenant,
        body.namespace_prefix,
        query=body.query,
        flt=body.filter,
        limit=body.limit,
        offset=body.offset,
        refresh=body.refresh_ttl,
    )


def listed(rt: Runtime, tenant: str, body: MemoryNamespaces) -> list[list[str]]:
    """A namespaces body's namespaces (this API's, or the LangGraph Store's)."""
    found = memory.list_namespaces(
        rt,
        tenant,
        prefix=body.prefix or (),
        suffix=body.suffix or (),
        max_depth=body.max_depth,
        limit=body.limit,
        offset=body.offset,
    )
    return [list(n) for n in found]


@router.post("/memory/search", response_model=ItemList)
def search(body: MemorySearch, rt: RuntimeDep, caller: ReadCaller) -> ItemList:
    """Items under a namespace prefix that match the filter; with a query, best first."""
    hits = searched(rt, caller.tenant, body)
    return ItemList(items=[item_view(h.item, h.score) for h in hits])


@router.post("/memory/namespaces", response_model=NamespaceList)
def namespaces(body: MemoryNamespaces, rt: RuntimeDep, caller: ReadCaller) -> NamespaceList:
    return NamespaceList(namespaces=listed(rt, caller.tenant, body))


@router.delete("/memory", response_model=Deleted)
def forget(
    rt: RuntimeDep,
    caller: WriteCaller,
    prefix: Annotated[
        str, Query(max_length=600, pattern=f"^\\*$|{DOTTED}", description="a.b, or * (all)")
    ],
) -> Deleted:
    """Delete a namespace and everything below it; ``prefix=*``: all of the tenant's memory."""
    labels = [] if prefix == "*" else dotted(prefix)
    return Deleted(deleted=memory.forget(rt, caller.tenant, labels))


@router.get("/runs/{run_id}/memory", response_model=MemoryEvents, tags=["runs"])
def run_memory(run_id: PathId, rt: RuntimeDep, caller: ReadCaller) -> MemoryEvents:
    """The run's reads and writes of long-term memory (``memory.read``, ``memory.written``
    events), in order."""
    with reading(rt.engine) as conn:
        if run_store.get_run(conn, run_id, caller.tenant) is None:
            raise NotFound(f"run {run_id} not found")
        rows = records.list_events_of(conn, run_id, sorted(MEMORY_EVENTS))
    return MemoryEvents(
        events=[
            MemoryEvent(
                seq=r["seq"], type=r["type"], data=iso_times(r["data"]), ts=iso(r["created_at"])
            )
            for r in rows
        ]
    )
