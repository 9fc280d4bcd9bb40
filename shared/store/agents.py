"""Agents created over the API: immutable versions per tenant and name (``agent_versions``).

A new version is the highest so far plus one; two writers racing for the same number meet the
primary key, and the loser takes the next number. The agents of the operator's file are not
stored here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from shared.errors import Conflict, NotFound, QuotaExceeded
from shared.store.tables import agent_versions as av

__all__ = [
    "AgentVersion",
    "Quota",
    "add_version",
    "count_agents",
    "get_version",
    "latest_versions",
    "list_versions",
]

_TRIES = 5


@dataclass(frozen=True, slots=True)
class AgentVersion:
    tenant: str
    name: str
    version: int
    spec: dict[str, Any]
    description: str | None
    meta: dict[str, Any] | None
    facade: dict[str, Any] | None
    created_at: float

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"

    @classmethod
    def of(cls, row: Mapping[Any, Any]) -> AgentVersion:
        return cls(
            tenant=row["tenant"],
            name=row["name"],
            version=int(row["version"]),
            spec=dict(row["spec"]),
            description=row["description"],
            meta=row["meta"],
            facade=row["facade"],
            created_at=float(row["created_at"]),
        )


def get_version(
    conn: Connection, tenant: str, name: str, version: int | None = None
) -> AgentVersion | None:
    """One version of the tenant's agent; ``version`` None: the latest."""
    q = sa.select(av).where(av.c.tenant == tenant, av.c.name == name)
    q = q.where(av.c.version == version) if version is not None else q
    row = conn.execute(q.order_by(av.c.version.desc()).limit(1)).mappings().first()
    return AgentVersion.of(row) if row is not None else None


def list_versions(
    conn: Connection, tenant: str, name: str, *, limit: int = 50, offset: int = 0
) -> list[AgentVersion]:
    """The agent's versions, newest first."""
    q = (
        sa.select(av)
        .where(av.c.tenant == tenant, av.c.name == name)
        .order_by(av.c.version.desc())
        .limit(limit)
        .offset(offset)
    )
    return [AgentVersion.of(r) for r in conn.execute(q).mappings()]


def latest_versions(
    conn: Connection, tenant: str, *, limit: int = 100, offset: int = 0
) -> list[AgentVersion]:
    """The latest version of each of the tenant's agents, by name."""
    newest = (
        sa.select(av.c.name, sa.func.max(av.c.version).label("version"))
        .where(av.c.tenant == tenant)
        .group_by(av.c.name)
        .subquery()
    )
    q = (
        sa.select(av)
        .join(newest, sa.and_(av.c.name == newest.c.name, av.c.version == newest.c.version))
        .where(av.c.tenant == tenant)
        .order_by(av.c.name)
        .limit(limit)
        .offset(offset)
    )
    return [AgentVersion.of(r) for r in conn.execute(q).mappings()]


def count_agents(conn: Connection, tenant: str) -> int:
    """How many agents (names) the tenant has."""
    q = sa.select(sa.func.count(sa.distinct(av.c.name))).where(av.c.tenant == tenant)
    return int(conn.execute(q).scalar_one())


@dataclass(frozen=True, slots=True)
class Quota:
    """The most agents a tenant and versions an agent may have (0: no limit)."""

    agents: int = 0
    versions: int = 0


def _check_quota(
    conn: Connection, tenant: str, name: str, current: AgentVersion | None, quota: Quota
) -> None:
    if current is None and quota.agents and count_agents(conn, tenant) >= quota.agents:
        raise QuotaExceeded(
            f"this tenant has {quota.agents} agents, the most it may have (TREADLE_MAX_AGENTS)"
        )
    if current is not None and quota.versions and current.version >= quota.versions:
        raise QuotaExceeded(
            f"agent {name!r} has {current.version} versions, the most an agent may have "
            "(TREADLE_MAX_AGENT_VERSIONS)"
        )


def add_version(
    conn: Connection,
    tenant: str,
    name: str,
    spec: dict[str, Any],
    ts: float,
    *,
    new: bool,
    description: str | None = None,
    meta: dict[str, Any] | None = None,
    facade: dict[str, Any] | None = None,
    quota: Quota = Quota(),  # noqa: B008 - frozen
) -> AgentVersion:
    """Add the next version. ``new``: the agent must not exist yet (Conflict), else it must
    (NotFound); either way within ``quota`` (QuotaExceeded). Runs in savepoints so a lost
    race on the number retries in the same transaction."""
    for _ in range(_TRIES):
        current = get_version(conn, tenant, name)
        if new and current is not None:
            raise Conflict(f"agent {name!r} exists; PUT /v1/agents/{name} adds a version")
        if not new and current is None:
            raise NotFound(f"agent {name!r} not found")
        _check_quota(conn, tenant, name, current, quota)
        row = {
            "tenant": tenant,
            "name": name,
            "version": 1 if current is None else current.version + 1,
            "spec": spec,
            "description": description,
            "meta": meta,
            "facade": facade,
            "created_at": ts,
        }
        try:
            with conn.begin_nested():
                conn.execute(sa.insert(av).values(**row))
        except IntegrityError:
            continue
        return AgentVersion.of(row)
    raise Conflict(f"agent {name!r} kept changing; try again")
