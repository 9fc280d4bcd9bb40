"""Every route takes its caller from the auth dependency (or is one of the few open ones), so
a route added later cannot forget tenancy; /v1 is also behind the key middleware."""

from __future__ import annotations

from collections.abc import Iterator

from fastapi.dependencies.models import Dependant
from fastapi.testclient import TestClient

from scheduler.app import create_app
from scheduler.http.auth import metrics_access, require
from shared.engine.runtime import Runtime
from shared.store import keys
from tests.support import api_routes

# open: health, the console's files, and LangGraph's server info (the key middleware leaves it
# open too: ``scheduler.http.auth._OPEN``)
OPEN = {"/healthz", "/", "/console", "/console/{path:path}", "/langgraph/info"}
GUARDS = {require(s) for s in keys.SCOPES} | {require(keys.WRITE, resume=True), metrics_access}


def _calls(dependant: Dependant) -> Iterator[object]:
    for sub in dependant.dependencies:
        yield sub.call
        yield from _calls(sub)


def test_every_route_is_guarded() -> None:
    app = create_app(lambda: None, auth="required")  # type: ignore[arg-type,return-value]
    routes = api_routes(app)  # through included routers (``app.routes`` holds the routers)
    unguarded = [
        f"{sorted(r.methods)} {r.path}"
        for r in routes
        if r.path not in OPEN and not GUARDS & set(_calls(r.dependant))
    ]
    assert len(routes) > 50
    assert unguarded == []


def test_unknown_v1_paths_still_need_a_key(secure_rt: Runtime) -> None:
    with TestClient(create_app(lambda: secure_rt)) as api:
        assert api.get("/v1/not-a-route").status_code == 401
