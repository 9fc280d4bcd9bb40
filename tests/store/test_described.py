"""The cached cursor description (``shared.store.described``) is the description."""

from __future__ import annotations

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
