"""The store: every SQL statement of treadle, typed rows out (``shared.store.rows``).

``runs`` (a run's hot row and what it was given), ``records`` (what a run appends: messages,
events, usage), ``calls`` (tool calls), ``write`` (the transition's guarded write and the
round's claim: the ``Store``, whose PostgreSQL subclass is in ``postgres``), and a module per
feature (threads, lineage, schedules, datasets, files, keys, agents, memory, spend, …).
"""

from __future__ import annotations

from sqlalchemy.engine import Engine

from shared.store.postgres import PostgresStore
from shared.store.write import Store

__all__ = ["store_for"]


_STORES = {"postgresql": PostgresStore(), "sqlite": Store()}  # stateless: one per dialect


def store_for(engine: Engine) -> Store:
    """The store of this engine's dialect."""
    return _STORES.get(engine.dialect.name, _STORES["sqlite"])
