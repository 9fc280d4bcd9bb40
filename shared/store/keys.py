"""Tenants and API keys.

A key is ``trd_`` + 43 URL-safe characters (256 random bits). It is shown once, when it is
created; only its SHA-256 is stored (a fast hash is enough for a high-entropy secret: there is
nothing to guess). A key belongs to one tenant and has scopes: ``runs:read`` (GET), ``runs:write``
(submit, cancel, answer, approve, create threads, upload files), ``trace`` (the request's
``traceparent``/``tracestate`` is joined; without it a request starts a trace of its own) and
``admin`` (everything, ``/metrics`` when it is not public).
"""

from __future__ import annotations

import hashlib
import re
import secrets
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, RowMapping

from shared.config import DEFAULT_TENANT
from shared.errors import NotFound, SpecError
from shared.store.runs import now
from shared.store.tables import api_keys, tenants

__all__ = [
    "ADMIN",
    "DEFAULT_SCOPES",
    "KEY_PREFIX",
    "READ",
    "SCOPES",
    "TRACE",
    "WRITE",
    "ApiKey",
    "NewKey",
    "create_key",
    "ensure_tenant",
    "find_key",
    "hash_key",
    "list_keys",
    "revoke_key",
]

KEY_PREFIX = "trd_"
READ, WRITE, ADMIN = "runs:read", "runs:write", "admin"
TRACE = "trace"  # a client's trace context is adopted (a trusted caller: the operator's own)
SCOPES = (READ, WRITE, TRACE, ADMIN)
DEFAULT_SCOPES = (READ, WRITE)
_TENANT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_SHOWN = 12  # characters of a key kept in clear (``prefix``) so people can tell keys apart


@dataclass(frozen=True, slots=True)
class ApiKey:
    id: str
    tenant: str
    prefix: str
    name: str | None
    scopes: tuple[str, ...]
    created_at: float
    revoked_at: float | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any] | RowMapping) -> ApiKey:
        return cls(
            id=row["id"],
            tenant=row["tenant"],
            prefix=row["prefix"],
            name=row["name"],
            scopes=tuple(row["scopes"] or ()),
            created_at=row["created_at"],
            revoked_at=row["revoked_at"],
        )


@dataclass(frozen=True, slots=True)
class NewKey:
    """A key just created: ``secret`` is the key itself, never stored or shown again."""

    key: ApiKey
    secret: str


def hash_key(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def _checked_scopes(scopes: Iterable[str]) -> tuple[str, ...]:
    chosen = tuple(dict.fromkeys(s.strip() for s in scopes if s.strip()))
    unknown = sorted(set(chosen) - set(SCOPES))
    if unknown:
        raise SpecError(f"unknown scope(s) {', '.join(unknown)}; one of {', '.join(SCOPES)}")
    if not chosen:
        raise SpecError("a key needs at least one scope")
    return chosen


def ensure_tenant(conn: Connection, name: str) -> None:
    """Create the tenant if it does not exist yet."""
    if not _TENANT.match(name):
        raise SpecError("a tenant name is 1-64 letters, digits, '_', '.' or '-'")
    found = conn.execute(sa.select(tenants.c.name).where(tenants.c.name == name)).first()
    if found is None:
        conn.execute(sa.insert(tenants).values(name=name, created_at=now()))


def create_key(
    conn: Connection, tenant: str, scopes: Sequence[str] = DEFAULT_SCOPES, name: str | None = None
) -> NewKey:
    """A new key for ``tenant`` (created if needed), in the caller's transaction. The keyless
    operator's tenant (``default``, auth off) is reserved: its runs get the operator's
    webhook and trust, so no key may act as it."""
    if tenant == DEFAULT_TENANT:
        raise SpecError(f"the tenant name {DEFAULT_TENANT!r} is reserved for the keyless operator")
    chosen = _checked_scopes(scopes)
    ensure_tenant(conn, tenant)
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    row = {
        "id": f"key_{uuid.uuid4().hex[:20]}",
        "tenant": tenant,
        "key_hash": hash_key(secret),
        "prefix": secret[:_SHOWN],
        "name": name,
        "scopes": list(chosen),
        "created_at": now(),
        "revoked_at": None,
    }
    conn.execute(sa.insert(api_keys).values(**row))
    return NewKey(ApiKey.from_row(row), secret)


# built once: every keyed request runs it, and a statement object keeps its cache key
_LIVE_KEY = sa.select(api_keys).where(
    api_keys.c.key_hash == sa.bindparam("b_hash"), api_keys.c.revoked_at.is_(None)
)


def find_key(conn: Connection, secret: str) -> ApiKey | None:
    """The live (not revoked) key whose secret this is, or None."""
    if not secret.startswith(KEY_PREFIX) or len(secret) > 200:
        return None
    row = conn.execute(_LIVE_KEY, {"b_hash": hash_key(secret)}).mappings().first()
    return ApiKey.from_row(row) if row is not None else None


def list_keys(conn: Connection, tenant: str | None = None) -> list[ApiKey]:
    query = sa.select(api_keys).order_by(api_keys.c.tenant, api_keys.c.created_at)
    if tenant is not None:
        query = query.where(api_keys.c.tenant == tenant)
    return [ApiKey.from_row(r) for r in conn.execute(query).mappings()]


def revoke_key(conn: Connection, key_id: str) -> ApiKey:
    """Revoke a key by id (idempotent); it stops working at once (every request reads it)."""
    row = conn.execute(sa.select(api_keys).where(api_keys.c.id == key_id)).mappings().first()
    if row is None:
        raise NotFound(f"key {key_id} not found")
    if row["revoked_at"] is None:
        conn.execute(sa.update(api_keys).where(api_keys.c.id == key_id).values(revoked_at=now()))
    return ApiKey.from_row(
        conn.execute(sa.select(api_keys).where(api_keys.c.id == key_id)).mappings().one()
    )
