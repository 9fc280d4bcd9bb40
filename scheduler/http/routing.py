"""The API's route class: a plain (``def``) endpoint crosses to a worker thread once.

FastAPI runs a plain endpoint in a worker thread and then, because the endpoint was not a
coroutine, validates its return value against ``response_model`` in a worker thread again: two
hand-offs between the event loop and the thread pool per request, each a wake-up of a thread
and one of the loop. ``OneHopRoute`` wraps a plain endpoint in a coroutine that runs it in the
thread pool (its database work stays off the loop), so the validation runs on the loop: next
to nothing for a view that is already a model instance (most are), more for a long list of
plain dicts (a LangGraph history page).

The wrapper keeps the endpoint's signature, name and docstring (``functools.wraps``; FastAPI
reads them through ``__wrapped__``), so parameters, dependencies and the OpenAPI document are
unchanged. One visible difference: a validation error's context names this module's file
beside the endpoint's line (FastAPI reads the file from the wrapper's code).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool

__all__ = ["OneHopRoute", "api_router"]


class OneHopRoute(APIRoute):
    """An ``APIRoute`` whose plain endpoint runs in the thread pool as a coroutine."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(path, _in_thread(endpoint), **kwargs)


def _in_thread(endpoint: Callable[..., Any]) -> Callable[..., Any]:
    """``endpoint`` as a coroutine running it in the thread pool; a coroutine, a generator
    (FastAPI streams those itself) or any other callable as it is."""
    streams = inspect.isgeneratorfunction(endpoint) or inspect.isasyncgenfunction(endpoint)
    if not inspect.isfunction(endpoint) or streams or inspect.iscoroutinefunction(endpoint):
        return endpoint

    @functools.wraps(endpoint)
    async def threaded(*args: Any, **kwargs: Any) -> Any:
        return await run_in_threadpool(endpoint, *args, **kwargs)

    return threaded


def api_router(**kwargs: Any) -> APIRouter:
    """An ``APIRouter`` of ``OneHopRoute``s (every router of the API is made here)."""
    return APIRouter(route_class=OneHopRoute, **kwargs)
