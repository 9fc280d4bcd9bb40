from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from scheduler.app import create_app
from shared.engine.runtime import Runtime


@pytest.fixture
def client(sqlite_rt: Runtime) -> Iterator[TestClient]:
    with TestClient(create_app(lambda: sqlite_rt)) as c:
        yield c
