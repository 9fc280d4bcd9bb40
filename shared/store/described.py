"""A psycopg cursor whose ``description`` is built once per statement shape per connection.

psycopg builds ``cursor.description`` afresh for every statement: one ``Column`` object per
result column, in Python (~2 µs each). SQLAlchemy reads it once per statement to set up the
result, so a statement returning a whole ``runs`` row (46 columns) pays ~100 µs before a row
is read; py-spy put it at 12-14 % of a worker's CPU on the HTTP-tool path
(``bench/results/worker-profile.md``). The columns a statement returns are fixed by its text
(the schema does not change under a running process: migrations run before it starts), so
the description is kept on the connection, keyed by the statement as sent and its column
count, and reused. A ``Column`` holds no reference to its cursor or result.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import Column

__all__ = ["DescribedCursor"]

_MAX = 512  # statement shapes kept per connection (the engine has a few dozen)


class DescribedCursor(psycopg.Cursor[Any]):
    """``psycopg.Cursor`` with a per-connection cache of ``description`` by statement."""

    @property
    def description(self) -> list[Column] | None:
        res, query = self.pgresult, self._query
        if res is None or query is None or not res.nfields:
            return super().description
        cache: dict[tuple[bytes, int], list[Column]] | None = getattr(
            self._conn, "_treadle_described", None
        )
        if cache is None:
            cache = {}
            self._conn._treadle_described = cache  # type: ignore[attr-defined]
        key = (query.query, res.nfields)
        found = cache.get(key)
        if found is None:
            found = super().description or []
            if len(cache) >= _MAX:
                cache.clear()
            cache[key] = found
        return list(found)
