"""Fixtures for the security tests: the API with auth required, keys per tenant, and (for the
SSRF tests) the tool tests' local servers and fake DNS."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from fastapi.testclient import TestClient

from scheduler.api import create_app
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.store import keys
from tests.tools.conftest import fake_dns, other_server, server  # noqa: F401  (fixtures)

MakeKey = Callable[..., str]


@pytest.fixture
def secure_rt(sqlite_rt: Runtime, stub: StubBroker) -> Runtime:
    """The SQLite runtime with API keys required (as in production)."""
    settings = sqlite_rt.settings.model_copy(update={"auth": "required"})
    return Runtime(engine=sqlite_rt.engine, settings=settings, publish=stub)


@pytest.fixture
def make_key(secure_rt: Runtime) -> MakeKey:
    """``make_key(tenant, scopes=(...))`` → a new key (the secret)."""

    def make(tenant: str, scopes: Sequence[str] = keys.DEFAULT_SCOPES) -> str:
        with secure_rt.engine.begin() as conn:
            return keys.create_key(conn, tenant, scopes).secret

    return make


@pytest.fixture
def api(secure_rt: Runtime) -> Iterator[TestClient]:
    with TestClient(create_app(lambda: secure_rt)) as c:
        yield c


def bearer(key: str) -> dict[str, Any]:
    return {"Authorization": f"Bearer {key}"}
