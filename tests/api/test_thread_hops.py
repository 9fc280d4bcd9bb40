"""A keyed request crosses from the event loop to the thread pool twice: the key check (it
reads the database) and the endpoint. The scope check and the runtime are coroutines, and the
response is validated on the loop (``scheduler.http.routing.OneHopRoute``), where FastAPI would
hand a plain endpoint's return value to a thread again."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio.to_thread
import pytest
from fastapi.testclient import TestClient

from scheduler.app import create_app
from scheduler.http.routing import OneHopRoute
from shared.engine.runtime import Runtime
from shared.store import keys
from tests.support import api_routes


def test_every_api_route_is_a_one_hop_route(sqlite_rt: Runtime) -> None:
    routes = api_routes(create_app(lambda: sqlite_rt))
    assert len(routes) > 50
    assert [r.path for r in routes if not isinstance(r.original_route, OneHopRoute)] == []


def test_a_keyed_request_crosses_to_a_thread_twice(
    sqlite_rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    with sqlite_rt.engine.begin() as conn:
        secret = keys.create_key(conn, "acme", [keys.READ, keys.WRITE]).secret
    crossed: list[str] = []
    real = anyio.to_thread.run_sync

    async def counting(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        inner = getattr(func, "func", func)  # run_in_threadpool hands over a partial
        crossed.append(getattr(inner, "__name__", repr(inner)))
        return await real(func, *args, **kwargs)

    with TestClient(create_app(lambda: sqlite_rt, auth="required")) as client:
        headers = {"Authorization": f"Bearer {secret}"}
        assert client.get("/v1/runs", headers=headers).status_code == 200  # warm
        monkeypatch.setattr(anyio.to_thread, "run_sync", counting)
        listed = client.get("/v1/runs", headers=headers)
        missing = client.get("/v1/runs/run_nope", headers=headers)
    assert listed.status_code == 200 and missing.status_code == 404
    assert crossed == ["identify", "list_runs", "identify", "get_run"]  # two per request
