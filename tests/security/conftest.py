"""Fixtures for the security tests: the API with auth required, keys per tenant, and (for the
SSRF tests) the tool tests' local servers and fake DNS."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from scheduler.app import create_app
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.store import keys
from shared.store.tables import metadata
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


DATA_TABLES = [t for t in metadata.sorted_tables if t.name != "workers"]
"""Every table a request could write (``workers`` holds the worker processes' heartbeats)."""


def row_counts(rt: Runtime) -> dict[str, int]:
    """Rows in every table of the schema: hostile input must leave them all as they were."""
    present = set(sa.inspect(rt.engine).get_table_names())
    with rt.engine.connect() as conn:
        return {
            t.name: int(conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one())
            for t in DATA_TABLES
            if t.name in present
        }


def with_settings(rt: Runtime, **changes: Any) -> Runtime:
    return Runtime(
        engine=rt.engine, publish=rt.publish, settings=rt.settings.model_copy(update=changes)
    )
