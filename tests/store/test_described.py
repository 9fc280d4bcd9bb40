"""The cached cursor description (``shared.store.described``) is the description."""

from __future__ import annotations

import psycopg
import pytest
import sqlalchemy as sa

from shared.store.described import DescribedCursor


def test_a_statement_reads_the_same_columns_twice_and_others_their_own(
    pg_engine: sa.engine.Engine,
) -> None:
    with pg_engine.connect() as conn:
        raw = conn.connection.driver_connection
        assert raw is not None and raw.cursor_factory is DescribedCursor
        for _ in range(2):
            row = conn.execute(sa.text("SELECT 1 AS a, 'x' AS b")).mappings().one()
            assert dict(row) == {"a": 1, "b": "x"}
        other = conn.execute(sa.text("SELECT 2 AS c")).mappings().one()
        assert dict(other) == {"c": 2}
        assert conn.execute(sa.text("SELECT 1 WHERE false")).first() is None


def test_a_prepared_statement_reads_its_columns_from_the_cache(
    pg_engine: sa.engine.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """psycopg prepares a statement from its fifth execution on a connection and then leaves
    the cursor's ``_query`` unset: the cache keys on the statement as sent, so a hot statement
    (the one that matters) still builds its ``Column`` objects once."""
    built: list[int] = []
    base = psycopg.Cursor.description.fget  # type: ignore[attr-defined]

    def counted(cursor: psycopg.Cursor[object]) -> object:
        built.append(1)
        return base(cursor)

    monkeypatch.setattr(psycopg.Cursor, "description", property(counted))
    statement = sa.text("SELECT CAST(:n AS integer) AS n, 'x' AS b")
    with pg_engine.connect() as conn:
        for n in range(12):
            assert dict(conn.execute(statement, {"n": n}).mappings().one()) == {"n": n, "b": "x"}
        raw = conn.connection.driver_connection
        assert raw is not None and raw.prepare_threshold is not None
        assert raw.prepare_threshold < 12  # some of these ran prepared
    assert len(built) == 1
