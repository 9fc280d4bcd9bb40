"""The schema's one ``MetaData``: every table of ``shared.store.tables`` is on it (what the
migrations are checked against)."""

from __future__ import annotations

import sqlalchemy as sa

__all__ = ["metadata"]

metadata = sa.MetaData()
