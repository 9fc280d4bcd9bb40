"""The API's pool tests a connection before handing it out by looking at its socket: a quiet
one is used as it is (no ``SELECT 1`` round trip), one the server closed is pinged, fails, and
is replaced, so no request fails on it."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from shared.store.db import make_engine, ping_on_checkout


def _counting_pings(engine: sa.engine.Engine, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    pings: list[int] = []
    real = engine.dialect.do_ping

    def do_ping(dbapi_connection: Any) -> bool:
        pings.append(1)
        return bool(real(dbapi_connection))

    monkeypatch.setattr(engine.dialect, "do_ping", do_ping)
    return pings


def test_a_quiet_connection_is_not_pinged_a_closed_one_is_replaced(
    pg_url: str, pg_engine: sa.engine.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine(pg_url, pool_size=2, max_overflow=0)
    ping_on_checkout(engine)
    ping_on_checkout(engine)  # idempotent: one listener
    pings = _counting_pings(engine, monkeypatch)
    try:
        pids = set()
        for _ in range(5):
            with engine.connect() as conn:
                pids.add(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar())
        assert (pings, len(pids)) == ([], 1)
        with pg_engine.connect() as admin:  # killed, as by a restart; wait until it is gone
            pid = pids.pop()
            admin.exec_driver_sql(f"SELECT pg_terminate_backend({pid}, 5000)")
            admin.commit()
        with engine.connect() as conn:  # the killed one is pinged, dropped, replaced
            assert conn.exec_driver_sql("SELECT 1").scalar() == 1
        assert len(pings) == 1, pings
    finally:
        engine.dispose()
