"""Threads over HTTP: ``POST /v1/threads``, ``GET /v1/threads/{id}``.

A run joins a thread with ``thread_id`` in ``POST /v1/runs``; it takes the thread's earlier
messages as history, and on a busy thread follows the thread's ``multitask`` policy.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from scheduler.http.auth import ReadCaller, WriteCaller
from scheduler.http.deps import RuntimeDep
from scheduler.http.routing import api_router
from scheduler.http.schemas import MessageView, PathId, message_view
from shared.engine import threads
from shared.errors import NotFound
from shared.isotime import iso
from shared.store import threads as store
from shared.store.db import reading

__all__ = ["ThreadCreate", "ThreadDetail", "ThreadView", "router"]


class ThreadCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    metadata: dict[str, Any] | None = None
    multitask: Literal["reject", "enqueue", "interrupt"] = Field(
        default="enqueue",
        description="A new run on a busy thread: reject (409), enqueue (start when the "
        "active run ends) or interrupt (cancel the active run, start the new one)",
    )


class ThreadView(BaseModel):
    id: str
    metadata: dict[str, Any] | None
    multitask: str
    created_at: str
    updated_at: str


class ThreadRun(BaseModel):
    id: str
    status: str
    kind: str


class ThreadMessageView(MessageView):
    run_id: str


class ThreadDetail(ThreadView):
    runs: list[ThreadRun]  # oldest first
    messages: list[ThreadMessageView]  # every run's own messages, runs oldest first


def thread_view(row: Mapping[Any, Any]) -> ThreadView:
    """The thread's columns (``meta`` as ``metadata``), its times in ISO 8601."""
    times = {"created_at": iso(row["created_at"]), "updated_at": iso(row["updated_at"])}
    return ThreadView.model_validate({**row, "metadata": row["meta"], **times})


def thread_detail(
    row: Mapping[Any, Any], runs: Sequence[Mapping[str, Any]], msgs: Sequence[Mapping[Any, Any]]
) -> ThreadDetail:
    return ThreadDetail(
        **thread_view(row).model_dump(),
        runs=[ThreadRun(id=r["id"], status=r["status"], kind=r["kind"]) for r in runs],
        messages=[
            ThreadMessageView(run_id=m["run_id"], **message_view(m).model_dump()) for m in msgs
        ],
    )


router = api_router(prefix="/v1", tags=["threads"])


@router.post("/threads", status_code=201, response_model=ThreadView)
def create(rt: RuntimeDep, caller: WriteCaller, body: ThreadCreate | None = None) -> ThreadView:
    body = body or ThreadCreate()
    thread_id = f"thr_{uuid.uuid4().hex[:24]}"
    row = threads.create_thread(rt, caller.tenant, body.metadata, body.multitask, thread_id)
    return thread_view(row)


@router.get("/threads/{thread_id}", response_model=ThreadDetail)
def get(thread_id: PathId, rt: RuntimeDep, caller: ReadCaller) -> ThreadDetail:
    with reading(rt.engine) as conn:
        row = store.get_thread(conn, thread_id, caller.tenant)
        if row is None:
            raise NotFound(f"thread {thread_id} not found")
        runs = store.thread_runs(conn, thread_id)
        msgs = store.thread_messages(conn, thread_id, started_only=False)
    return thread_detail(row, runs, msgs)
