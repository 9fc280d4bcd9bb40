"""treadle's Celery app (``worker.app``) with a smaller database pool, for bench workers:
``celery -A bench.tworker worker ...``. The engine's pool is 20 + 20 overflow per process and
not configurable; with several worker processes on a PostgreSQL shared with other test runs
(max_connections 100) that runs out of connections. ``BENCH_POOL_SIZE`` (default 10) sets
``pool_size`` (= ``max_overflow``); nothing else changes."""

from __future__ import annotations

import os
from typing import Any

from shared.store import db

_make_engine = db.make_engine
POOL_SIZE = int(os.environ.get("BENCH_POOL_SIZE", "10"))


def _bench_make_engine(url: str, pool_size: int = POOL_SIZE) -> Any:
    return _make_engine(url, pool_size=pool_size)


db.make_engine = _bench_make_engine  # get_engine looks it up at call time

from worker.app import app  # noqa: E402

__all__ = ["app"]
