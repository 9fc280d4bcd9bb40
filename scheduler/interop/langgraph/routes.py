"""LangGraph Server routes over treadle (docs/api.md), mounted at ``/langgraph``:
what ``langgraph-sdk`` 0.4 speaks. A registered agent's name is the ``assistant_id``; a thread
is a treadle thread; each LangGraph run is a segment of a treadle run (``segments``).

``Location`` and ``Content-Location`` are relative to the SDK's base URL (no mount prefix).
"""

from __future__ import annotations

from typing import Any

from scheduler.http.routing import api_router
from scheduler.interop.langgraph import assistants, crons, runs, threads

__all__ = ["router"]

_info = api_router()


@_info.get("/info")
def info() -> dict[str, Any]:
    return {
        "version": "treadle",
        "langgraph_py_version": None,
        "flags": {"assistants": True, "crons": True, "langsmith": False},
        "host": {"kind": "treadle"},
    }


router = api_router(tags=["langgraph"])
"""The LangGraph Server routes; include with ``prefix="/langgraph"``."""
# in this order (the first matching route serves)
router.include_router(_info)
router.include_router(assistants.router)
router.include_router(threads.router)
router.include_router(runs.router)
router.include_router(crons.router)
