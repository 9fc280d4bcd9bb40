"""The schema, SQLAlchemy Core (tables: docs/durability.md). Times are epoch seconds (floats)
on every dialect.

Append-only where it grows: a round inserts its new ``messages``, ``usage``, ``events`` and
``tool_calls`` rows and updates one ``runs`` row, so the bytes written per round do not grow
with the length of the run.

One ``metadata`` (``meta``); a run's tables are in ``run``, a tenant's other resources in
``tenant``. Import them from here.
"""

from __future__ import annotations

from shared.store.tables import run, tenant
from shared.store.tables.meta import metadata
from shared.store.tables.run import *  # noqa: F403 (the names are run.__all__)
from shared.store.tables.tenant import *  # noqa: F403 (the names are tenant.__all__)

__all__ = ["metadata"]
__all__ += run.__all__
__all__ += tenant.__all__
