"""A psycopg cursor whose ``description`` is built once per statement shape per connection.

psycopg builds ``cursor.description`` afresh for every statement: one ``Column`` object per
result column, in Python (~2 µs each). SQLAlchemy reads it once per statement to set up the
result, so a statement returning a whole ``runs`` row (46 columns) pays ~100 µs before a row
is read; py-spy put it at 12-14 % of a worker's CPU on the HTTP-tool path
(``bench/results/worker-profile.md``). The columns a statement returns are fixed by its text
(the schema does not change under a running process: migrations run before it starts), so
the description is kept on the connection, keyed by the statement as sent and its column
count, and reused. A ``Column`` holds no reference to its cursor or result.

psycopg also keeps the parse of a statement's text (its ``%(name)s`` placeholders found by a
regular expression) only for statements under 4,096 bytes and 50 parameters, against ORM
statements of ever-varying length; a transition's one-statement write (the guarded UPDATE
returning the whole run row, with its rows beside) is longer, so it was parsed again on
every execute (~2 % of a round's CPU in py-spy). Our statements come in a bounded set of
shapes: their parse is kept too, per process, in a bounded LRU cache.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import psycopg
from psycopg import Column
from psycopg import _queries as pg_queries

__all__ = ["DescribedCursor"]

_MAX = 512  # statement shapes kept per connection (the engine has a few dozen)


@lru_cache(maxsize=_MAX)
def _parsed(query: str | bytes, encoding: str) -> Any:
    """psycopg's parse of a statement's text, by the text as SQLAlchemy hands it over (the
    same ``str`` object from its compiled cache: its hash is computed once)."""
    text = query.encode(encoding) if isinstance(query, str) else query
    return pg_queries._query2pg_nocache(text, encoding)


class DescribedCursor(psycopg.Cursor[Any]):
    """``psycopg.Cursor`` with a per-connection cache of ``description`` by statement."""

    _sent: bytes | None = None  # the text of the statement last executed

    @property
    def description(self) -> list[Column] | None:
        # not psycopg's ``_query``: it is left unset when a statement runs prepared (from its
        # fifth execution on a connection), which is when the cache matters most
        res, sent = self.pgresult, self._sent
        if res is None or sent is None or not res.nfields:
            return super().description
        cache: dict[tuple[bytes, int], list[Column]] | None = getattr(
            self._conn, "_treadle_described", None
        )
        if cache is None:
            cache = {}
            self._conn._treadle_described = cache  # type: ignore[attr-defined]
        key = (sent, res.nfields)
        found = cache.get(key)
        if found is None:
            found = super().description or []
            if len(cache) >= _MAX:
                cache.clear()
            cache[key] = found
        return list(found)

    def _convert_query(self, query: Any, params: Any = None) -> pg_queries.PostgresQuery:
        """psycopg's conversion (remembered as the statement sent), with the parse of a long
        statement's text cached too."""
        pgq = self._converted(query, params)
        self._sent = pgq.query
        return pgq

    def _converted(self, query: Any, params: Any) -> pg_queries.PostgresQuery:
        if params is None or self._query_cls is not pg_queries.PostgresQuery:
            return super()._convert_query(query, params)
        pgq = pg_queries.PostgresQuery(self._tx)
        if not isinstance(query, bytes | str):
            pgq.convert(query, params)
            return pgq
        pgq.query, pgq._want_formats, pgq._order, pgq._parts = _parsed(query, self._tx.encoding)
        pgq.dump(params)
        return pgq
