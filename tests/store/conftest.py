"""The store's contract (as langgraph's checkpoint conformance suite): each operation of
``shared.store`` checked on SQLite and on PostgreSQL with the same tests, through the
runtime's ``Store`` face and the store's modules."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from shared.engine.runtime import Runtime


@pytest.fixture(params=["sqlite", "postgresql"])
def rt(request: pytest.FixtureRequest) -> Iterator[Runtime]:
    runtime: Runtime = request.getfixturevalue("sqlite_rt")
    if request.param == "postgresql":
        runtime = replace(runtime, engine=request.getfixturevalue("pg_engine"))
    yield runtime
