"""Run priorities on the broker: a run's ``priority`` (0-9, 9 first, default 5) is the
priority of every message of its rounds and tools.

* Redis (kombu's transport): one list per priority, ``<queue>`` for 0 and ``<queue>:<p>`` for
  p = 1-9 (``priority_steps`` 0-9, separator ``:``), read lowest number first — so a run's
  priority p is sent as 9 - p.
* RabbitMQ: the queues are declared with ``x-max-priority`` 10; p is sent as it is.
* ``memory://`` (embedded mode) has no priorities.

Across queues (rounds, tools, webhooks) a worker keeps Celery's round-robin order: a tool
call of a running run is never starved by other runs' rounds.
"""

from __future__ import annotations

__all__ = ["DEFAULT_PRIORITY", "PRIORITY_SEP", "broker_priority", "is_redis", "queue_keys"]

DEFAULT_PRIORITY = 5
PRIORITY_SEP = ":"


def is_redis(url: str) -> bool:
    return url.startswith(("redis://", "rediss://"))


def broker_priority(url: str, priority: int) -> int:
    """A run's priority (0-9, 9 first) as the broker's for ``url``."""
    p = max(0, min(9, priority))
    return 9 - p if is_redis(url) else p


def queue_keys(queue: str) -> list[str]:
    """The Redis lists holding one queue's messages, one per priority (without the key
    prefix): what a queue depth sums."""
    return [queue, *(f"{queue}{PRIORITY_SEP}{p}" for p in range(1, 10))]
