"""The API's dependencies in FastAPI's own idiom: a route takes ``rt: RuntimeDep`` (and a
caller: ``scheduler.http.auth.ReadCaller`` …) instead of closing over a runtime getter.

``create_app`` puts the runtime getter on ``app.state.get_rt``; a test swaps the runtime by
building the app with its own getter (or through ``app.dependency_overrides[runtime]``).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from shared.engine.runtime import Runtime

__all__ = ["RuntimeDep", "runtime"]


async def runtime(request: Request) -> Runtime:
    """The app's runtime (its database pool tests each connection on checkout). A coroutine:
    it does no I/O, and FastAPI would hand a plain function to a worker thread and back."""
    rt: Runtime = request.app.state.get_rt()
    return rt


RuntimeDep = Annotated[Runtime, Depends(runtime)]
"""A route's runtime: ``def get(run_id: str, rt: RuntimeDep, caller: ReadCaller)``."""
