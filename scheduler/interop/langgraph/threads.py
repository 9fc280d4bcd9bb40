"""The LangGraph thread routes: create, get and search threads, a thread's state and its
history of checkpoints (``client.threads.*``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from fastapi import Body
from sqlalchemy.engine import Connection

from scheduler.http.auth import ReadCaller, WriteCaller
from scheduler.http.fleet import searchable
from scheduler.http.routing import api_router
from scheduler.interop.langgraph.bodies import (
    HistoryBody,
    SearchBody,
    ThreadBody,
)
from scheduler.interop.langgraph.facade import PROTOCOL, Facade
from scheduler.interop.langgraph.views import current_state, state_at_end, thread_view
from shared.interop.shapes import (
    lg_thread_status,
)
from shared.interop.thread_ids import scoped_id
from shared.store import segments as segs
from shared.store import threads as thread_store
from shared.store.db import reading

__all__ = ["router"]

router = api_router()


@router.post("/threads")
def create_thread(
    f: Facade, caller: WriteCaller, body: Annotated[ThreadBody | None, Body()] = None
) -> dict[str, Any]:
    row = f.create_thread(caller.tenant, body or ThreadBody())
    with reading(f.rt.engine) as conn:
        return thread_view(conn, row)


@router.get("/threads/{thread_id}")
def get_thread(thread_id: str, f: Facade, caller: ReadCaller) -> dict[str, Any]:
    with reading(f.rt.engine) as conn:
        return thread_view(conn, f.thread(conn, caller.tenant, thread_id))


@router.post("/threads/search")
def search_threads(
    f: Facade, caller: ReadCaller, body: Annotated[SearchBody | None, Body()] = None
) -> list[dict[str, Any]]:
    body = body or SearchBody()
    with reading(f.rt.engine) as conn:
        rows = _search(conn, caller.tenant, body)
        return [thread_view(conn, t) for t in rows[body.offset : body.offset + body.limit]]


@router.get("/threads/{thread_id}/state")
def get_state(thread_id: str, f: Facade, caller: ReadCaller) -> dict[str, Any]:
    with reading(f.rt.engine) as conn:
        return current_state(conn, f.thread(conn, caller.tenant, thread_id)["id"])


@router.post("/threads/{thread_id}/history")
def history(
    thread_id: str,
    f: Facade,
    caller: ReadCaller,
    body: Annotated[HistoryBody | None, Body()] = None,
) -> list[dict[str, Any]]:
    limit = (body or HistoryBody()).limit
    with reading(f.rt.engine) as conn:
        key = f.thread(conn, caller.tenant, thread_id)["id"]
        states = [current_state(conn, key)]
        for seg in segs.thread_segments(conn, key, PROTOCOL, limit=limit):
            state = state_at_end(conn, segs.load_leg(conn, seg))
            ids = {s["checkpoint"]["checkpoint_id"] for s in states}
            if state is not None and state["checkpoint"]["checkpoint_id"] not in ids:
                states.append(state)
    return states[:limit]


def _search(conn: Connection, tenant: str, body: SearchBody) -> list[Mapping[Any, Any]]:
    """The tenant's threads (newest first) whose metadata holds ``body.metadata``, in
    ``body.status``: the store selects by ids and string values (``search_threads``), the
    other values and the status are checked here."""
    want = body.metadata or {}
    strings = {k: v for k, v in want.items() if searchable(k, v)}
    ids = [*body.ids, *(scoped_id(tenant, i) for i in body.ids)] if body.ids else None
    rows: list[Mapping[Any, Any]] = [
        t
        for t in thread_store.search_threads(conn, tenant, ids=ids, metadata=strings)
        if all((t["meta"] or {}).get(k) == v for k, v in want.items())
    ]
    if body.status:
        rows = [t for t in rows if lg_thread_status(segs.latest_run(conn, t["id"])) == body.status]
    return rows
