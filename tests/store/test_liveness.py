"""The API's pool tests a connection before handing it out: one back in use soon with a quiet
socket is used as it is (no ``SELECT 1`` round trip); one the server closed, or one idle too
long, is pinged, and replaced when the ping fails, so no request fails on it."""

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
    assert len(engine.pool.dispatch.checkout) == 1
    pings = _counting_pings(engine, monkeypatch)
    try:
        pids = set()
        for _ in range(5):
            with engine.connect() as conn:
                pids.add(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar())
        assert (len(pings), len(pids)) == (1, 1)  # the new connection's only ping
        with pg_engine.connect() as admin:  # killed, as by a restart; wait until it is gone
            pid = pids.pop()
            gone = admin.exec_driver_sql(f"SELECT pg_terminate_backend({pid}, 5000)").scalar()
            admin.commit()
        assert gone is True
        with engine.connect() as conn:  # the killed one is pinged, fails, is reconnected
            assert conn.exec_driver_sql("SELECT 1").scalar() == 1
        assert len(pings) == 3, pings  # the failed ping, then the new connection's
        monkeypatch.setattr("shared.store.db._Liveness.FRESH_S", 0.0)
        with engine.connect() as conn:  # idle too long (here: at all): pinged
            assert conn.exec_driver_sql("SELECT 1").scalar() == 1
        assert len(pings) == 4, pings
    finally:
        engine.dispose()
