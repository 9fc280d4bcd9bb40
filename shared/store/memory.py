"""The SQL of long-term memory (``memory_items``): a tenant's items, ``(namespace, key) →
JSON value``, each maybe with a TTL (docs/memory.md). An item past its ``expires_at`` is
gone for every read at once; the reaper deletes its row later (``purge_expired``).

Namespaces are stored as their labels joined by ``.`` (``shared.agent.memory``); a prefix
matches itself and everything below it, never a sibling whose name merely starts the same
(``users.u1`` is not under ``users.u``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from shared.agent.memory import SEPARATOR, join_namespace, split_namespace
from shared.store.tables import memory_items as mi

__all__ = [
    "MemoryItem",
    "count_live",
    "delete_item",
    "delete_prefix",
    "exists",
    "get_item",
    "item_id",
    "list_namespaces",
    "purge_expired",
    "put_item",
    "refresh",
    "scan",
]

_BATCH = 500


@dataclass(frozen=True, slots=True)
class MemoryItem:
    tenant: str
    namespace: tuple[str, ...]
    key: str
    value: dict[str, Any]
    text: str
    created_at: float
    updated_at: float
    ttl_s: float | None = None
    expires_at: float | None = None
    run_id: str | None = None
    embedding: tuple[float, ...] | None = None  # only when read for search (``scan``)

    @property
    def id(self) -> str:
        return item_id(self.tenant, self.namespace, self.key)

    @classmethod
    def of(cls, row: Mapping[Any, Any], *, with_embedding: bool = False) -> MemoryItem:
        vector = row.get("embedding") if with_embedding else None
        return cls(
            tenant=str(row["tenant"]),
            namespace=tuple(split_namespace(str(row["namespace"]))),
            key=str(row["key"]),
            value=dict(row["value"]),
            text=str(row["text"]),
            created_at=float(row["created_at"]),
            updated_at=float(row["updated_at"]),
            ttl_s=row["ttl_s"],
            expires_at=row["expires_at"],
            run_id=row["run_id"],
            embedding=tuple(float(x) for x in vector) if vector else None,
        )


def item_id(tenant: str, namespace: Sequence[str], key: str) -> str:
    """The row's primary key: a digest of the three (a long key stays out of the index)."""
    raw = "\x00".join([tenant, join_namespace(namespace), key])
    return hashlib.sha256(raw.encode()).hexdigest()


def _live(ts: float) -> sa.ColumnElement[bool]:
    return sa.or_(mi.c.expires_at.is_(None), mi.c.expires_at > ts)


def _under(prefix: Sequence[str]) -> sa.ColumnElement[bool]:
    """The namespace is ``prefix`` or below it (an empty prefix: every namespace)."""
    if not prefix:
        return sa.true()
    path = join_namespace(prefix)
    escaped = path.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    below = mi.c.namespace.like(escaped + SEPARATOR + "%", escape="\\")
    return sa.or_(mi.c.namespace == path, below)


_COLUMNS = [c for c in mi.c if c.name != "embedding"]


def get_item(
    conn: Connection, tenant: str, namespace: Sequence[str], key: str, ts: float
) -> MemoryItem | None:
    """The item, unless it does not exist or has expired."""
    q = sa.select(*_COLUMNS).where(mi.c.id == item_id(tenant, namespace, key), _live(ts))
    row = conn.execute(q).mappings().first()
    return MemoryItem.of(row) if row is not None else None


def exists(conn: Connection, tenant: str, namespace: Sequence[str], key: str, ts: float) -> bool:
    q = sa.select(mi.c.id).where(mi.c.id == item_id(tenant, namespace, key), _live(ts))
    return conn.execute(q).first() is not None


def put_item(
    conn: Connection,
    tenant: str,
    namespace: Sequence[str],
    key: str,
    values: Mapping[str, Any],
    ts: float,
) -> MemoryItem:
    """Insert or replace the item (``values``: value, text, embedding, embedding_model,
    ttl_s, expires_at, run_id). A replaced item keeps its ``created_at`` (an expired one is
    new again). Two writers racing on a new key: the second replaces the first."""
    ident = item_id(tenant, namespace, key)
    row: dict[str, Any] = {**values, "updated_at": ts}
    for _ in range(3):
        old = conn.execute(
            sa.select(mi.c.created_at, mi.c.expires_at).where(mi.c.id == ident)
        ).first()
        if old is not None:
            fresh = old.expires_at is not None and old.expires_at <= ts
            conn.execute(
                sa.update(mi)
                .where(mi.c.id == ident)
                .values(**row, created_at=ts if fresh else old.created_at)
            )
            break
        try:
            with conn.begin_nested():
                conn.execute(
                    sa.insert(mi).values(
                        id=ident,
                        tenant=tenant,
                        namespace=join_namespace(namespace),
                        key=key,
                        created_at=ts,
                        **row,
                    )
                )
            break
        except IntegrityError:
            continue  # inserted by another writer meanwhile: replace it
    found = conn.execute(sa.select(*_COLUMNS).where(mi.c.id == ident)).mappings().one()
    return MemoryItem.of(found)


def count_live(conn: Connection, tenant: str, ts: float) -> int:
    q = sa.select(sa.func.count()).select_from(mi).where(mi.c.tenant == tenant, _live(ts))
    return int(conn.execute(q).scalar_one())


def refresh(conn: Connection, items: Sequence[MemoryItem], ts: float) -> None:
    """Start the TTL of these items again (those that have one)."""
    for item in items:
        if item.ttl_s is not None:
            conn.execute(
                sa.update(mi)
                .where(mi.c.id == item.id, _live(ts))
                .values(expires_at=ts + item.ttl_s)
            )


def delete_item(conn: Connection, tenant: str, namespace: Sequence[str], key: str) -> bool:
    """Delete the item; False when there was none (an expired one counts as none)."""
    ident = item_id(tenant, namespace, key)
    q = sa.delete(mi).where(mi.c.id == ident, mi.c.tenant == tenant)
    return bool(conn.execute(q).rowcount)


def delete_prefix(conn: Connection, tenant: str, prefix: Sequence[str]) -> int:
    """Every item of the tenant under ``prefix`` (an empty prefix: all of its memory)."""
    q = sa.delete(mi).where(mi.c.tenant == tenant, _under(prefix))
    return int(conn.execute(q).rowcount)


def scan(
    conn: Connection,
    tenant: str,
    prefix: Sequence[str],
    ts: float,
    limit: int,
    max_bytes: int,
) -> list[MemoryItem]:
    """The live items under ``prefix``, most recently updated first, with their embeddings
    (what search ranks): at most ``limit`` items, and no more once their values and texts
    add up to ``max_bytes`` (rows are streamed, so a tenant's large items cannot make one
    search read them all)."""
    q = (
        sa.select(mi)
        .where(mi.c.tenant == tenant, _under(prefix), _live(ts))
        .order_by(mi.c.updated_at.desc(), mi.c.id)
        .limit(limit)
    )
    out: list[MemoryItem] = []
    seen = 0
    rows = conn.execution_options(stream_results=True, yield_per=100).execute(q).mappings()
    for row in rows:
        item = MemoryItem.of(row, with_embedding=True)
        out.append(item)
        seen += len(item.text) + len(json.dumps(item.value))
        if seen >= max_bytes:
            break
    return out


def list_namespaces(
    conn: Connection, tenant: str, prefix: Sequence[str], ts: float, limit: int
) -> list[tuple[str, ...]]:
    """The distinct namespaces of the tenant's live items under ``prefix``, sorted."""
    q = (
        sa.select(mi.c.namespace)
        .where(mi.c.tenant == tenant, _under(prefix), _live(ts))
        .group_by(mi.c.namespace)
        .order_by(mi.c.namespace)
        .limit(limit)
    )
    return [tuple(split_namespace(str(ns))) for ns in conn.execute(q).scalars()]


def purge_expired(conn: Connection, ts: float, limit: int = _BATCH) -> int:
    """Delete up to ``limit`` expired items (any tenant's); returns how many went."""
    ids = sa.select(mi.c.id).where(mi.c.expires_at <= ts).limit(limit).scalar_subquery()
    return int(conn.execute(sa.delete(mi).where(mi.c.id.in_(ids))).rowcount)
