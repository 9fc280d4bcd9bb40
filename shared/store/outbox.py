"""The outbox of webhook deliveries: a row per delivery message not yet consumed (rounds and
tool calls have none: their state says what is due, see ``shared.store.redrive``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from shared.store.tables import outbox

__all__ = ["delete", "due", "postpone"]


def delete(conn: Connection, outbox_id: int | None) -> None:
    if outbox_id is not None:
        conn.execute(sa.delete(outbox).where(outbox.c.id == outbox_id))


def due(conn: Connection, ts: float, limit: int = 500) -> list[Mapping[Any, Any]]:
    q = sa.select(outbox).where(outbox.c.available_at <= ts).order_by(outbox.c.id).limit(limit)
    return list(conn.execute(q).mappings())


def postpone(conn: Connection, ids: Sequence[int], until: float) -> None:
    if ids:
        conn.execute(sa.update(outbox).where(outbox.c.id.in_(ids)).values(available_at=until))
