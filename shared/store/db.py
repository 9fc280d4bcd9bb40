"""Engines: PostgreSQL (psycopg 3) or SQLite (WAL, ``BEGIN IMMEDIATE`` writes)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Engine

__all__ = ["get_engine", "is_sqlite", "make_engine", "migrate", "reset_engines"]

_engines: dict[str, Engine] = {}
_lock = threading.Lock()


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"


def _sqlite_engine(url: str, pool_size: int) -> Engine:
    path = url.removeprefix("sqlite:///")
    if path and path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(
        url,
        connect_args={"timeout": 30, "check_same_thread": False, "isolation_level": None},
        pool_size=pool_size,
        max_overflow=pool_size,
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _rec: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        # take the write lock up front: no deadlock when a reader upgrades to a writer
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def make_engine(url: str, pool_size: int = 20, max_overflow: int = 5) -> Engine:
    """Size the pool to the threads that use it: N worker processes × (pool + overflow) must
    stay under the server's max_connections (100 by default on PostgreSQL)."""
    if url.startswith("sqlite"):
        return _sqlite_engine(url, pool_size)
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    # no pre-ping (a round trip per checkout, 4 per round): a connection broken by a database
    # restart fails one task, which retries; SQLAlchemy then drops the whole stale pool
    return sa.create_engine(
        url,
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_pre_ping=False,
        pool_recycle=1800,
        pool_timeout=30,
    )


def get_engine(url: str | None = None) -> Engine:
    """The process-wide engine for ``url`` (default: the configured database)."""
    from shared.config import get_settings

    settings = get_settings()
    url = url or settings.database_url
    with _lock:
        engine = _engines.get(url)
        if engine is None:
            size = settings.db_pool_size or settings.worker_concurrency + 4
            engine = _engines[url] = make_engine(url, pool_size=size)
        return engine


def reset_engines() -> None:
    with _lock:
        for engine in _engines.values():
            engine.dispose()
        _engines.clear()


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest Alembic revision."""
    from alembic import command
    from alembic.config import Config

    here = Path(__file__).parent / "migrations"
    cfg = Config()
    cfg.set_main_option("script_location", str(here))
    cfg.attributes["connection_engine"] = engine
    with _lock:
        command.upgrade(cfg, "head")
