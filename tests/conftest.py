"""Fixtures: SQLite + stub broker for fast tests; PostgreSQL, Redis and real Celery worker
processes for the production-mode tests (missing services fail in CI, skip locally)."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import tests.plugins  # noqa: F401  (test tools: the API validates tool names at submit)
from shared.config import Settings
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.store.db import make_engine, migrate
from shared.store.tables import metadata
from tests.support import (
    FUZZ_TALLY_ENV,
    PG_ADMIN,
    REDIS_BASE,
    WorkerProcs,
    fuzz_summary,
    need_service,
)

# The suite's specs use the scripted test model; an operator's server refuses it by default.
# Set here so every Settings() and every worker or API process the tests start inherit it.
os.environ.setdefault("TREADLE_ALLOW_TEST_MODELS", "true")


@pytest.fixture
def stub() -> StubBroker:
    return StubBroker()


@pytest.fixture
def sqlite_rt(tmp_path: Path, stub: StubBroker) -> Iterator[Runtime]:
    url = f"sqlite:///{tmp_path / 'treadle.db'}"
    engine = make_engine(url)
    migrate(engine)
    settings = Settings(database_url=url, broker_url="memory://", redrive_seconds=15.0)
    yield Runtime(engine=engine, settings=settings, publish=stub)
    engine.dispose()


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    name = f"treadle_t_{uuid.uuid4().hex[:10]}"
    try:
        admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT", pool_pre_ping=True)
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:
        need_service("PostgreSQL", exc)
    url = PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
    engine = make_engine(url)
    migrate(engine)
    engine.dispose()
    yield url
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture
def pg_engine(pg_url: str) -> Iterator[sa.engine.Engine]:
    engine = make_engine(pg_url)
    migrate(engine)
    present = set(sa.inspect(engine).get_table_names())
    with engine.begin() as conn:
        for table in reversed(metadata.sorted_tables):
            if table.name in present:
                conn.execute(table.delete())
    yield engine
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def any_rt(request: pytest.FixtureRequest, stub: StubBroker) -> Iterator[Runtime]:
    """A runtime on SQLite (embedded mode), then on PostgreSQL (production mode), on the stub
    broker: for what the store does per dialect (full-text search, memory)."""
    if request.param == "sqlite":
        yield request.getfixturevalue("sqlite_rt")
        return
    engine = request.getfixturevalue("pg_engine")
    url = request.getfixturevalue("pg_url")
    yield Runtime(
        engine=engine, settings=Settings(database_url=url, broker_url="memory://"), publish=stub
    )


SESSION = uuid.uuid4().hex[:8]
# concurrent test sessions do not share a broker, nor the xdist workers of one session: the
# run's id (one for all its workers) picks the first database, each worker the next ones (a
# random pick per worker would give two workers the same database one time in 15, and the
# one's flushdb would empty the other's broker)
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
_RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID") or SESSION
REDIS_DB = 1 + (int(uuid.uuid5(uuid.NAMESPACE_OID, _RUN).hex[:8], 16) + _WORKER) % 15


@pytest.fixture
def redis_url() -> str:
    import redis

    url = f"{REDIS_BASE}/{REDIS_DB}"
    try:
        client = redis.Redis.from_url(url, socket_timeout=3)
        client.flushdb()
        client.close()
    except Exception as exc:
        need_service("Redis", exc)
    return url


@pytest.fixture
def prod_rt(
    pg_url: str, pg_engine: sa.engine.Engine, redis_url: str, fast_recovery: dict[str, str]
) -> Iterator[Runtime]:
    """A Runtime on PostgreSQL + Redis that publishes to real Celery workers."""
    from shared.celery_app import make_app
    from shared.wiring import CeleryPublisher

    overrides = {k.removeprefix("TREADLE_").lower(): v for k, v in fast_recovery.items()}
    settings = Settings(
        **{
            "database_url": pg_url,
            "broker_url": redis_url,
            "broker_prefix": f"t{SESSION}:",
            "redrive_seconds": 15.0,
            "auth": "off",
            **overrides,
        }
    )  # API tests on loopback, no keys
    celery_app = make_app(settings)
    yield Runtime(engine=pg_engine, settings=settings, publish=CeleryPublisher(celery_app))
    celery_app.close()


@pytest.fixture
def fast_recovery() -> dict[str, str]:
    """Short leases and re-drive times, for tests about crashes (set in workers and API)."""
    return {}


@pytest.fixture
def call_log(tmp_path: Path) -> Path:
    return tmp_path / "model_calls.log"


@pytest.fixture
def workers(
    tmp_path: Path, pg_url: str, redis_url: str, call_log: Path, fast_recovery: dict[str, str]
) -> Iterator[WorkerProcs]:
    env = {
        "TREADLE_DATABASE_URL": pg_url,
        "TREADLE_BROKER_URL": redis_url,
        "TREADLE_BROKER_PREFIX": f"t{SESSION}:",
        "TREADLE_MODEL_CALL_LOG": str(call_log),
        "TREADLE_REDRIVE_SECONDS": "15",
        "TREADLE_PLUGINS": "tests.plugins",
        "TREADLE_TEST_EFFECTS": str(tmp_path / "effects.log"),
        **fast_recovery,
    }
    procs = WorkerProcs(env, tmp_path)
    yield procs
    procs.stop_all()


def pytest_configure(config: pytest.Config) -> None:
    """The session's folder for the fuzz figures (xdist workers inherit it)."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        os.environ[FUZZ_TALLY_ENV] = tempfile.mkdtemp(prefix="treadle-fuzz-")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The schemathesis summary line (tests/security/test_fuzz.py), when the fuzz ran."""
    folder = os.environ.get(FUZZ_TALLY_ENV)
    if folder and "PYTEST_XDIST_WORKER" not in os.environ:
        line = fuzz_summary(Path(folder))
        if line:
            terminalreporter.write_line(line)
        shutil.rmtree(folder, ignore_errors=True)
