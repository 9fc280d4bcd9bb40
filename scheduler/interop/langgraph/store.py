"""The LangGraph Store routes on the facade (``/langgraph/store/...``): what
``langgraph-sdk``'s ``client.store`` speaks, over treadle's long-term memory
(``shared.engine.memory``; docs/memory.md).

``put_item`` (``PUT /store/items``, 204; ``ttl`` in minutes, ``index``), ``get_item``
(``GET /store/items?namespace=a.b&key=k``, 404 when there is none), ``delete_item``
(``DELETE /store/items`` with a JSON body, 204), ``search_items`` (``POST
/store/items/search``), ``list_namespaces`` (``POST /store/namespaces``).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Response
from pydantic import BaseModel, ConfigDict, Field

from scheduler.http.auth import ReadCaller, WriteCaller
from scheduler.http.deps import RuntimeDep
from scheduler.http.memory import (
    Index,
    ItemAt,
    Key,
    MemoryNamespaces,
    MemorySearch,
    Namespace,
    listed,
    searched,
)
from scheduler.http.routing import api_router
from scheduler.http.schemas import NUMBER
from shared.engine import memory
from shared.errors import NotFound
from shared.isotime import iso
from shared.store.memory import MemoryItem

__all__ = ["router"]

router = api_router(prefix="/store", tags=["langgraph"])
MINUTE = 60.0
MAX_TTL_MINUTES = memory.MAX_TTL_S / MINUTE
Minutes = Annotated[float, Field(gt=0, le=MAX_TTL_MINUTES, allow_inf_nan=False), NUMBER]


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")  # the SDK may send more than treadle reads


class StorePut(_Body):
    namespace: Namespace = Field(min_length=1)
    key: Key
    value: dict[str, Any]
    index: Index = None
    ttl: Minutes | None = Field(default=None, description="Minutes")


class StoreDelete(_Body):
    namespace: Namespace = Field(min_length=1)
    key: Key


class StoreSearch(MemorySearch):
    model_config = ConfigDict(extra="ignore")


class StoreNamespaces(MemoryNamespaces):
    model_config = ConfigDict(extra="ignore")


def _item(item: MemoryItem, score: float | None = None, scored: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {
        "namespace": list(item.namespace),
        "key": item.key,
        "value": item.value,
        "created_at": iso(item.created_at),
        "updated_at": iso(item.updated_at),
    }
    if scored:
        out["score"] = score
    return out


@router.put("/items", status_code=204, response_class=Response)
def put_item(body: StorePut, rt: RuntimeDep, caller: WriteCaller) -> Response:
    ttl = body.ttl * MINUTE if body.ttl is not None else None
    memory.put_item(
        rt, caller.tenant, body.namespace, body.key, body.value, ttl_s=ttl, index=body.index
    )
    return Response(status_code=204)


@router.get("/items")
def get_item(rt: RuntimeDep, caller: ReadCaller, at: ItemAt) -> dict[str, Any]:
    item = at.read(rt, caller.tenant)
    if item is None:
        raise NotFound(f"item {at.key!r} not found in {at.namespace!r}")
    return _item(item)


@router.delete("/items", status_code=204, response_class=Response)
def delete_item(body: StoreDelete, rt: RuntimeDep, caller: WriteCaller) -> Response:
    memory.delete_item(rt, caller.tenant, body.namespace, body.key)  # absent: done all the same
    return Response(status_code=204)


@router.post("/items/search")
def search_items(body: StoreSearch, rt: RuntimeDep, caller: ReadCaller) -> dict[str, Any]:
    hits = searched(rt, caller.tenant, body)
    scored = bool(body.query)
    return {"items": [_item(h.item, h.score, scored) for h in hits]}


@router.post("/namespaces")
def list_namespaces(body: StoreNamespaces, rt: RuntimeDep, caller: ReadCaller) -> dict[str, Any]:
    return {"namespaces": listed(rt, caller.tenant, body)}
