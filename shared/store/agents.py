"""Agents created over the API: immutable versions per tenant and name (``agent_versions``).

A new version is the highest so far plus one; two writers racing for the same number meet the
primary key, and the loser takes the next number. The agents of the operator's file are not
stored here.

Tags (``agent_tags``): a name's ``prod``, ``staging``... each points at one of its versions;
``name@prod`` resolves through it and moving it is a rollback. The tag ``latest``, when set,
is what the bare name resolves to (a LangGraph ``set_latest``); a new version takes it back
(the new version is the latest). Deleting an agent deletes its versions and tags; its runs
keep the spec they started with (``run_specs``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from shared.errors import Conflict, NotFound, QuotaExceeded
from shared.store.tables import agent_tags as at
from shared.store.tables import agent_versions as av

__all__ = [
    "LATEST_TAG",
    "TAG",
    "AgentVersion",
    "Quota",
    "add_version",
    "count_agents",
    "delete_agent",
    "drop_tag",
    "get_version",
    "latest_versions",
    "list_versions",
    "set_tag",
    "tags_by_version",
]

TAG = r"^[a-z][a-z0-9_-]{0,31}$"
"""A tag's name (a letter first: ``name@3`` is a version, ``name@prod`` a tag)."""
LATEST_TAG = "latest"

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
    conn: Connection, tenant: str, name: str, version: int | str | None = None
) -> AgentVersion | None:
    """One version of the tenant's agent: ``version`` a number, a tag (``"prod"``), or None
    for the latest (the ``latest`` tag's version when it is set, else the highest)."""
    if isinstance(version, str):
        return _tagged(conn, tenant, name, version)
    if version is None:
        pinned = _tagged(conn, tenant, name, LATEST_TAG)
        if pinned is not None:
            return pinned
    return _numbered(conn, tenant, name, version)


def _numbered(conn: Connection, tenant: str, name: str, version: int | None) -> AgentVersion | None:
    """Version ``version``, or the highest (None)."""
    q = sa.select(av).where(av.c.tenant == tenant, av.c.name == name)
    q = q.where(av.c.version == version) if version is not None else q
    row = conn.execute(q.order_by(av.c.version.desc()).limit(1)).mappings().first()
    return AgentVersion.of(row) if row is not None else None


def _tagged(conn: Connection, tenant: str, name: str, tag: str) -> AgentVersion | None:
    q = (
        sa.select(av)
        .join(at, sa.and_(at.c.tenant == av.c.tenant, at.c.name == av.c.name))
        .where(av.c.tenant == tenant, av.c.name == name, at.c.tag == tag)
        .where(av.c.version == at.c.version)
    )
    row = conn.execute(q).mappings().first()
    return AgentVersion.of(row) if row is not None else None


def tags_by_version(conn: Connection, tenant: str, name: str) -> dict[int, list[str]]:
    """The agent's tags, by the version each points at."""
    q = (
        sa.select(at.c.version, at.c.tag)
        .where(at.c.tenant == tenant, at.c.name == name)
        .order_by(at.c.tag)
    )
    out: dict[int, list[str]] = {}
    for version, tag in conn.execute(q):
        out.setdefault(int(version), []).append(str(tag))
    return out


def set_tag(
    conn: Connection, tenant: str, name: str, tag: str, version: int, ts: float
) -> AgentVersion:
    """Point ``tag`` at ``version`` (made or moved); NotFound when there is no such version."""
    found = _numbered(conn, tenant, name, version)
    if found is None:
        raise NotFound(f"agent {name!r} has no version {version}")
    drop_tag(conn, tenant, name, tag)
    row = {"tenant": tenant, "name": name, "tag": tag, "version": version, "updated_at": ts}
    conn.execute(sa.insert(at).values(**row))
    return found


def drop_tag(conn: Connection, tenant: str, name: str, tag: str) -> bool:
    """Remove the tag; False when it was not set."""
    stmt = sa.delete(at).where(at.c.tenant == tenant, at.c.name == name, at.c.tag == tag)
    return conn.execute(stmt).rowcount > 0


def delete_agent(conn: Connection, tenant: str, name: str) -> int:
    """Delete the agent's versions and tags; how many versions there were."""
    conn.execute(sa.delete(at).where(at.c.tenant == tenant, at.c.name == name))
    return int(conn.execute(sa.delete(av).where(av.c.tenant == tenant, av.c.name == name)).rowcount)


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
    """The latest version of each of the tenant's agents, by name (the ``latest`` tag's
    version where it is set, else the highest)."""
    newest = (
        sa.select(av.c.name, sa.func.max(av.c.version).label("version"))
        .where(av.c.tenant == tenant)
        .group_by(av.c.name)
        .subquery()
    )
    pinned = (
        sa.select(at.c.name, at.c.version)
        .where(at.c.tenant == tenant, at.c.tag == LATEST_TAG)
        .subquery()
    )
    chosen = sa.func.coalesce(pinned.c.version, newest.c.version)
    q = (
        sa.select(av)
        .join(newest, av.c.name == newest.c.name)
        .outerjoin(pinned, pinned.c.name == newest.c.name)
        .where(av.c.tenant == tenant, av.c.version == chosen)
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
        current = _numbered(conn, tenant, name, None)
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
        drop_tag(conn, tenant, name, LATEST_TAG)  # the new version is the latest
        return AgentVersion.of(row)
    raise Conflict(f"agent {name!r} kept changing; try again")
