"""How many messages wait in the broker's queues, read by the reaper before it re-sends: a
dispatch nobody took while its queue still holds messages is plausibly among them (a
backlog, not a loss), so re-sending it would only lengthen the queue.

Redis: ``LLEN`` of each queue's lists, one per message priority (kombu's
``global_keyprefix`` included). RabbitMQ: a
passive ``queue.declare`` answers the ready-message count. Other brokers (``memory://``):
unknown (None), and the reaper re-sends by its clock alone.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import redis
from kombu import Connection

from shared.config import Settings
from shared.names import ALL_QUEUES
from shared.priorities import queue_keys

__all__ = ["broker_depth"]

log = logging.getLogger("treadle.reaper")
_clients: dict[str, Any] = {}
_lock = threading.Lock()


def broker_depth(settings: Settings) -> dict[str, int] | None:
    """Messages waiting per queue; None when the broker cannot say (or is unreachable)."""
    url = settings.broker_url
    try:
        if url.startswith(("redis://", "rediss://")):
            return _redis_depth(url, settings.broker_prefix)
        if url.startswith(("amqp://", "amqps://", "pyamqp://")):
            return _amqp_depth(url)
    except Exception as exc:
        log.warning("queue depth unknown (%s: %s)", type(exc).__name__, exc)
    return None


def _redis_depth(url: str, prefix: str) -> dict[str, int]:
    with _lock:
        client = _clients.get(url)
        if client is None:
            client = _clients[url] = redis.Redis.from_url(
                url, socket_timeout=2, socket_connect_timeout=2
            )
    pipe = client.pipeline(transaction=False)
    for q in ALL_QUEUES:
        for key in queue_keys(q):  # one list per message priority
            pipe.llen(f"{prefix}{key}")
    counts = iter(pipe.execute())
    return {q: sum(int(next(counts)) for _ in queue_keys(q)) for q in ALL_QUEUES}


def _amqp_depth(url: str) -> dict[str, int]:
    out: dict[str, int] = {}
    with Connection(url, connect_timeout=2) as conn:
        for q in ALL_QUEUES:
            channel: Any = conn.channel()
            try:
                _name, count, _consumers = channel.queue_declare(queue=q, passive=True)
                out[q] = int(count)
            except Exception:  # not declared yet: nothing waits in it
                out[q] = 0
            finally:
                channel.close()
    return out
