"""The floor: a tiny Celery app whose only task is one hop of a chain. Each hop does one small
versioned SQL transaction (INSERT a log row + ``UPDATE … WHERE version = v``) and sends the
next hop. Same broker, same Redis transport options and task options as treadle's worker.

``celery -A bench.floorapp worker -P threads -Q bench.floor`` with ``BENCH_FLOOR_DB`` (the
SQLAlchemy URL), ``TREADLE_BROKER_URL`` and ``TREADLE_BROKER_PREFIX``. ``BENCH_FLOOR_EVENTS=1``
turns on Celery task events as treadle's config does; ``BENCH_FLOOR_PREPING=1`` uses
``pool_pre_ping`` as treadle's engine does (both off: the raw floor).
"""

from __future__ import annotations

import os
import time
from typing import Any

import sqlalchemy as sa
from celery import Celery

QUEUE = "bench.floor"
POOL = int(os.environ.get("BENCH_POOL_SIZE", "5"))
TASK = "bench.hop"


def floor_config(broker_url: str, prefix: str, events: bool) -> dict[str, Any]:
    """treadle's Celery settings for Redis (worker/app.py), minus its tasks and routes."""
    opts: dict[str, Any] = {
        "visibility_timeout": 3600,
        "socket_timeout": 30,
        "socket_connect_timeout": 10,
        "health_check_interval": 25,
        "retry_on_timeout": True,
    }
    if prefix:
        opts["global_keyprefix"] = prefix
    return {
        "broker_url": broker_url,
        "broker_transport_options": opts,
        "broker_connection_retry_on_startup": True,
        "result_backend": None,
        "task_ignore_result": True,
        "task_serializer": "json",
        "accept_content": ["json"],
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "worker_hijack_root_logger": False,
        "worker_redirect_stdouts": False,
        "worker_send_task_events": events,
        "task_send_sent_event": events,
        "task_default_queue": QUEUE,
    }


def make_app(broker_url: str, prefix: str, events: bool = False) -> Celery:
    celery = Celery("bench_floor")
    celery.conf.update(floor_config(broker_url, prefix, events))
    return celery


app = make_app(
    os.environ.get("TREADLE_BROKER_URL", "redis://127.0.0.1:6379/0"),
    os.environ.get("TREADLE_BROKER_PREFIX", ""),
    os.environ.get("BENCH_FLOOR_EVENTS") == "1",
)
_engine: sa.engine.Engine | None = None

INSERT = sa.text(
    "INSERT INTO floor_log (chain, hop, started_at, note) VALUES (:chain, :hop, :ts, :note)"
)
UPDATE = sa.text(
    "UPDATE floor_chain SET version = version + 1, updated_at = :ts "
    "WHERE id = :chain AND version = :v"
)


def engine() -> sa.engine.Engine:
    global _engine
    if _engine is None:
        _engine = sa.create_engine(
            os.environ["BENCH_FLOOR_DB"],
            pool_size=POOL,
            max_overflow=POOL,
            pool_pre_ping=os.environ.get("BENCH_FLOOR_PREPING") == "1",
        )
    return _engine


@app.task(name=TASK, bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def hop(self: Any, chain: int, n: int, last: int, sleep_even: float = 0.0) -> None:
    """Hop ``n`` of ``chain``; hops with an even ``n`` first sleep ``sleep_even`` (a model call
    of a throughput floor: a "round" is then an even hop plus an odd one)."""
    ts = time.time()
    if sleep_even and n % 2 == 0:
        time.sleep(sleep_even)
    try:
        with engine().begin() as conn:
            conn.execute(INSERT, {"chain": chain, "hop": n, "ts": ts, "note": f"hop {n}"})
            ok = conn.execute(UPDATE, {"ts": ts, "chain": chain, "v": n}).rowcount == 1
    except sa.exc.OperationalError as exc:  # like treadle's tasks: retry soon
        raise self.retry(countdown=0.5, max_retries=20) from exc
    if ok and n < last:
        hop.apply_async((chain, n + 1, last, sleep_even), queue=QUEUE)
