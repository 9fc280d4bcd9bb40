"""Repository functions of the knowledge base: datasets, documents, chunks and
the full-text search, per dialect (migration 0006 made the index):

* SQLite: FTS5 ``dataset_chunks_fts`` (porter stemming, unicode61) ranked by ``bm25``;
* PostgreSQL: the generated ``tsv`` column (``to_tsvector('english', search_text)``, GIN)
  matched by ``websearch_to_tsquery`` and ranked by ``ts_rank``.

Both take the terms OR-ed (``shared.agent.knowledge``): passages matching more, and rarer,
terms rank first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, RowMapping

from shared.agent.knowledge import Query, fts5_query, websearch_query
from shared.store.tables import dataset_chunks, dataset_documents, datasets

__all__ = [
    "chunks_by_id",
    "embedded_chunks",
    "find_datasets",
    "fts_search",
    "get_dataset",
    "insert_dataset",
    "insert_document",
    "list_datasets",
    "list_documents",
    "set_embedding_model",
]

TS_CONFIG = "english"


def insert_dataset(conn: Connection, row: dict[str, Any], ts: float) -> RowMapping:
    stmt = sa.insert(datasets).values(**row, created_at=ts, updated_at=ts).returning(*datasets.c)
    return conn.execute(stmt).mappings().one()


def get_dataset(conn: Connection, dataset_id: str, tenant: str | None) -> RowMapping | None:
    q = sa.select(datasets).where(datasets.c.id == dataset_id)
    if tenant is not None:
        q = q.where(datasets.c.tenant == tenant)
    return conn.execute(q).mappings().first()


def find_datasets(conn: Connection, tenant: str, refs: Sequence[str]) -> list[RowMapping]:
    """The tenant's datasets named by id or by name (all of them when ``refs`` is empty)."""
    q = sa.select(datasets).where(datasets.c.tenant == tenant)
    if refs:
        q = q.where(sa.or_(datasets.c.id.in_(refs), datasets.c.name.in_(refs)))
    return list(conn.execute(q.order_by(datasets.c.created_at, datasets.c.id)).mappings())


def list_datasets(conn: Connection, tenant: str, limit: int = 200) -> list[RowMapping]:
    q = (
        sa.select(datasets)
        .where(datasets.c.tenant == tenant)
        .order_by(datasets.c.created_at.desc(), datasets.c.id.desc())
        .limit(limit)
    )
    return list(conn.execute(q).mappings())


def insert_document(
    conn: Connection, row: dict[str, Any], chunks: Sequence[dict[str, Any]], ts: float
) -> RowMapping:
    """The document and its chunks (``{idx, text, search_text, source, embedding}``); the
    index follows by itself (SQLite triggers, PostgreSQL generated column)."""
    doc = (
        conn.execute(
            sa.insert(dataset_documents)
            .values(**row, chunks=len(chunks), created_at=ts)
            .returning(*dataset_documents.c)
        )
        .mappings()
        .one()
    )
    if chunks:
        conn.execute(
            sa.insert(dataset_chunks),
            [
                {"dataset_id": row["dataset_id"], "document_id": row["id"], "created_at": ts, **c}
                for c in chunks
            ],
        )
    conn.execute(
        sa.update(datasets).where(datasets.c.id == row["dataset_id"]).values(updated_at=ts)
    )
    return doc


def set_embedding_model(conn: Connection, dataset_id: str, model: str) -> None:
    conn.execute(
        sa.update(datasets).where(datasets.c.id == dataset_id).values(embedding_model=model)
    )


def list_documents(conn: Connection, dataset_id: str) -> list[RowMapping]:
    q = (
        sa.select(dataset_documents)
        .where(dataset_documents.c.dataset_id == dataset_id)
        .order_by(dataset_documents.c.created_at, dataset_documents.c.id)
    )
    return list(conn.execute(q).mappings())


def fts_search(
    conn: Connection, dataset_ids: Sequence[str], query: Query, limit: int
) -> list[tuple[int, float]]:
    """(chunk id, score) of the best keyword matches in the datasets, best first."""
    if not dataset_ids or query.empty:
        return []
    if conn.dialect.name == "postgresql":
        return _pg_search(conn, dataset_ids, query, limit)
    return _sqlite_search(conn, dataset_ids, query, limit)


def _sqlite_search(
    conn: Connection, dataset_ids: Sequence[str], query: Query, limit: int
) -> list[tuple[int, float]]:
    stmt = sa.text(
        "SELECT c.id, bm25(dataset_chunks_fts) AS rank FROM dataset_chunks_fts "
        "JOIN dataset_chunks AS c ON c.id = dataset_chunks_fts.rowid "
        "WHERE dataset_chunks_fts MATCH :q AND c.dataset_id IN :ids "
        "ORDER BY rank, c.id LIMIT :n"
    ).bindparams(sa.bindparam("ids", expanding=True))
    rows = conn.execute(stmt, {"q": fts5_query(query), "ids": list(dataset_ids), "n": limit})
    return [(int(i), -float(rank)) for i, rank in rows]  # bm25: lower is better


def _pg_search(
    conn: Connection, dataset_ids: Sequence[str], query: Query, limit: int
) -> list[tuple[int, float]]:
    parts = websearch_query(query)
    assert parts is not None
    terms, excluded = parts
    exclude = "AND NOT c.tsv @@ websearch_to_tsquery(:cfg, :x) " if excluded else ""
    stmt = sa.text(
        "SELECT c.id, ts_rank(c.tsv, q.query) AS score "
        "FROM dataset_chunks AS c, (SELECT websearch_to_tsquery(:cfg, :q) AS query) AS q "
        f"WHERE c.dataset_id IN :ids AND c.tsv @@ q.query {exclude}"
        "ORDER BY score DESC, c.id LIMIT :n"
    ).bindparams(sa.bindparam("ids", expanding=True))
    rows = conn.execute(
        stmt, {"cfg": TS_CONFIG, "q": terms, "x": excluded, "ids": list(dataset_ids), "n": limit}
    )
    return [(int(i), float(score)) for i, score in rows]


def chunks_by_id(conn: Connection, ids: Sequence[int]) -> dict[int, RowMapping]:
    """Chunks with their document's name (``document``)."""
    if not ids:
        return {}
    q = (
        sa.select(
            dataset_chunks.c.id,
            dataset_chunks.c.dataset_id,
            dataset_chunks.c.document_id,
            dataset_chunks.c.idx,
            dataset_chunks.c.text,
            dataset_chunks.c.source,
            dataset_documents.c.name.label("document"),
        )
        .join(dataset_documents, dataset_documents.c.id == dataset_chunks.c.document_id)
        .where(dataset_chunks.c.id.in_(list(ids)))
    )
    return {int(r["id"]): r for r in conn.execute(q).mappings()}


def embedded_chunks(
    conn: Connection, dataset_ids: Sequence[str], limit: int
) -> list[tuple[int, list[float]]]:
    """(chunk id, embedding) of the datasets' embedded chunks, at most ``limit``."""
    q = (
        sa.select(dataset_chunks.c.id, dataset_chunks.c.embedding)
        .where(
            dataset_chunks.c.dataset_id.in_(list(dataset_ids)),
            dataset_chunks.c.embedding.is_not(None),
        )
        .order_by(dataset_chunks.c.id)
        .limit(limit)
    )
    return [(int(i), list(e)) for i, e in conn.execute(q) if e]
