"""Deleting over HTTP: ``DELETE /v1/runs/{id}`` (an ended run and every row of it, its
sub-agent runs too), ``DELETE /v1/threads/{id}`` (the thread and its runs, all ended),
``DELETE /v1/files/{id}``, ``DELETE /v1/datasets/{id}``. Each is ``204``; another tenant's id is
``404``; a run or thread still going, or a run another run reads as its history, is ``409``.
"""

from __future__ import annotations

from fastapi import Response

from scheduler.http.auth import WriteCaller
from scheduler.http.deps import RuntimeDep
from scheduler.http.routing import api_router
from scheduler.http.schemas import PathId
from shared.engine import retention
from shared.engine.attachments import store_for
from shared.errors import NotFound

__all__ = ["router"]

_DELETED: dict[int | str, dict[str, str]] = {204: {"description": "Deleted"}}


router = api_router(prefix="/v1", tags=["retention"])


@router.delete("/runs/{run_id}", status_code=204, response_class=Response, responses=_DELETED)
def delete_run(run_id: PathId, rt: RuntimeDep, caller: WriteCaller) -> Response:
    """An ended run and every row of it (messages, events, usage, tool calls, webhook
    deliveries...), its sub-agent runs too. 409: not ended (cancel it first), a sub-agent
    run (delete its parent), or the history of another run (a thread's next run, a fork)."""
    retention.delete_run(rt, caller.tenant, run_id)
    return Response(status_code=204)


@router.delete("/threads/{thread_id}", status_code=204, response_class=Response, responses=_DELETED)
def delete_thread(thread_id: PathId, rt: RuntimeDep, caller: WriteCaller) -> Response:
    """The thread, its runs (all ended, else 409) and its crons."""
    retention.delete_thread(rt, caller.tenant, thread_id)
    return Response(status_code=204)


@router.delete("/files/{file_id}", status_code=204, response_class=Response, responses=_DELETED)
def delete_file(file_id: PathId, rt: RuntimeDep, caller: WriteCaller) -> Response:
    """The file's bytes and metadata (a run still reading it fails to)."""
    if not store_for(rt).delete(file_id, caller.tenant):
        raise NotFound(f"file {file_id} not found")
    return Response(status_code=204)


@router.delete(
    "/datasets/{dataset_id}", status_code=204, response_class=Response, responses=_DELETED
)
def delete_dataset(dataset_id: PathId, rt: RuntimeDep, caller: WriteCaller) -> Response:
    """The dataset, its documents and their chunks (and their search index)."""
    retention.delete_dataset(rt, caller.tenant, dataset_id)
    return Response(status_code=204)
