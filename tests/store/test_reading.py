"""``shared.store.db.reading``: a read connection goes back to the pool without a ROLLBACK, so
psycopg keeps the statements it prepared on it (a ROLLBACK makes it send ``DEALLOCATE ALL``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
import sqlalchemy as sa

from shared.store.db import make_engine, migrate, reading

HOT = sa.text("SELECT count(*) FROM runs WHERE id = :id")
PREPARED = sa.text("SELECT count(*) FROM pg_prepared_statements")
Opener = Callable[[sa.Engine], AbstractContextManager[sa.Connection]]


@pytest.fixture
def one_conn(pg_url: str) -> Iterator[sa.Engine]:
    engine = make_engine(pg_url, pool_size=1, max_overflow=0)  # every checkout: the same one
    yield engine
    engine.dispose()


def _prepared_after_reads(engine: sa.Engine, opener: Opener) -> int:
    for i in range(8):  # psycopg prepares a statement from its 5th run on a connection
        with opener(engine) as conn:
            conn.execute(HOT, {"id": f"r{i}"}).scalar_one()
    with opener(engine) as conn:
        return int(conn.execute(PREPARED).scalar_one())


def test_reads_keep_their_prepared_statements(one_conn: sa.Engine) -> None:
    assert _prepared_after_reads(one_conn, reading) >= 1


def test_reads_in_a_transaction_lose_them_at_each_checkin(one_conn: sa.Engine) -> None:
    """The cost ``reading`` avoids, shown on the plain connection."""
    assert _prepared_after_reads(one_conn, lambda e: e.connect()) == 0


def test_the_pool_gives_the_next_user_a_transaction_again(one_conn: sa.Engine) -> None:
    with reading(one_conn) as conn:
        assert conn.connection.dbapi_connection.autocommit is True  # type: ignore[attr-defined]
    with one_conn.connect() as conn:  # back to the default: a transaction again
        assert conn.connection.dbapi_connection.autocommit is False  # type: ignore[attr-defined]


def test_sqlite_reads_as_before(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'r.db'}")
    migrate(engine)
    with reading(engine) as conn:
        assert conn.execute(HOT, {"id": "x"}).scalar_one() == 0
    engine.dispose()
