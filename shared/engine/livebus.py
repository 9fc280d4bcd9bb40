"""Live events across processes: Redis pub/sub, one channel per run (``treadle:live:<run>``).

Model deltas go here and are not stored one by one; durable events are in the ``events``
table and are also announced here so SSE tails wake at once.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import redis

__all__ = ["RedisBus"]

log = logging.getLogger("treadle.live")
Callback = Callable[[dict[str, Any]], None]


class RedisBus:
    def __init__(self, url: str) -> None:
        self._pub = redis.Redis.from_url(url, socket_timeout=5)
        self._sub_client = redis.Redis.from_url(url, socket_timeout=None)
        self._subs: dict[str, list[Callback]] = defaultdict(list)
        self._lock = threading.Lock()
        self._pubsub: Any = None
        self._thread: threading.Thread | None = None

    @staticmethod
    def channel(run_id: str) -> str:
        return f"treadle:live:{run_id}"

    def publish(self, run_id: str, event: dict[str, Any]) -> None:
        try:
            self._pub.publish(self.channel(run_id), json.dumps(event))
        except redis.RedisError:
            log.warning("live publish failed for %s", run_id, exc_info=True)

    def subscribe(self, run_id: str, callback: Callback) -> Callable[[], None]:
        with self._lock:
            self._ensure_listener()
            first = not self._subs[run_id]
            self._subs[run_id].append(callback)
            if first:
                self._pubsub.subscribe(self.channel(run_id))

        def cancel() -> None:
            with self._lock:
                subs = self._subs.get(run_id, [])
                if callback in subs:
                    subs.remove(callback)
                if not subs and run_id in self._subs:
                    del self._subs[run_id]
                    self._pubsub.unsubscribe(self.channel(run_id))

        return cancel

    def _ensure_listener(self) -> None:
        if self._thread is not None:
            return
        self._pubsub = self._sub_client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call,unused-ignore]
        self._pubsub.subscribe("treadle:live:_")  # a pubsub needs one channel before listen()
        self._thread = threading.Thread(target=self._listen, daemon=True, name="treadle-live")
        self._thread.start()

    def _listen(self) -> None:
        while True:
            try:
                for msg in self._pubsub.listen():
                    self._dispatch(msg)
            except Exception:
                log.warning("live listener error; resubscribing", exc_info=True)
                threading.Event().wait(1.0)

    def _dispatch(self, msg: dict[str, Any]) -> None:
        if msg.get("type") != "message":
            return
        channel = msg["channel"].decode() if isinstance(msg["channel"], bytes) else msg["channel"]
        run_id = channel.rsplit(":", 1)[-1]
        with self._lock:
            subs = list(self._subs.get(run_id, ()))
        event = json.loads(msg["data"])
        for cb in subs:
            try:
                cb(event)
            except Exception:  # one broken subscriber must not stop the listener
                log.warning("live subscriber failed for %s", run_id, exc_info=True)
