"""The defaults a user gets honour the design card and do not throttle a lone tenant: every
round its own Celery task (in-place driving opt-in), no per-tenant cap unless an operator sets
one, and pools that never hold in-flight work below the worker's ``-c``."""

from __future__ import annotations

import pytest

from shared.config import Settings
from shared.llm import profiles
from shared.store.db import default_pool_size
from worker.app import adopt_concurrency


def test_every_round_is_its_own_task_and_no_tenant_cap_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for var in (
        "TREADLE_WORKER_IN_PLACE_S",
        "TREADLE_WORKER_READ_TOOLS_IN_ROUND",
        "TREADLE_TENANT_ACTIVE_RUNS",
    ):
        monkeypatch.delenv(var, raising=False)
    settings = Settings()
    assert settings.worker_in_place_s == 0
    assert settings.worker_read_tools_in_round is False  # every external call its own task
    assert settings.tenant_active_runs == 0


def test_the_worker_concurrency_follows_dash_c_unless_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TREADLE_WORKER_CONCURRENCY", raising=False)
    settings = Settings()
    adopt_concurrency(settings, 500)
    assert settings.worker_concurrency == 500
    monkeypatch.setenv("TREADLE_WORKER_CONCURRENCY", "12")
    pinned = Settings()
    adopt_concurrency(pinned, 500)
    assert pinned.worker_concurrency == 12


def test_the_database_pool_covers_what_can_use_it_at_once() -> None:
    assert default_pool_size(500, 4) == 12  # only the gate's threads touch the database
    assert default_pool_size(2, 4) == 6  # never more than the threads (+4)
    assert default_pool_size(64, 0) == 68  # no gate: every thread may


def test_the_model_client_pool_never_caps_below_concurrency(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TREADLE_WORKER_CONCURRENCY", "1000")
    from shared.config import reset_settings

    reset_settings()
    try:
        shards = profiles._shards()
        limits = profiles._LIMITS
        profiles.close_http_clients()
        clients = [profiles.http_client("http://shards.test/v1") for _ in range(2 * shards)]
    finally:
        monkeypatch.delenv("TREADLE_WORKER_CONCURRENCY")
        reset_settings()
        profiles.close_http_clients()
    # httpcore's pool scans every connection per request: 1,000 calls go through 32 pools
    assert shards == 32 == len({id(c) for c in clients})
    assert clients[:shards] == clients[shards:]  # in turn
    assert all(c.is_closed for c in clients)
    assert limits.max_connections is None
    assert limits.max_keepalive_connections * shards >= 1000
