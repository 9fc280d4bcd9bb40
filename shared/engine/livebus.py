"""Live events across processes: Redis pub/sub, one channel per run (``treadle:live:<run>``).

Model deltas go here and are not stored one by one; durable events are in the ``events``
table and are also announced here so SSE tails wake at once.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections import defaultdict, deque
from collections.abc import Callable
from typing import Any, Protocol

import redis

from shared.engine.metrics import LIVE_DROPPED

__all__ = ["WAKE", "InProcessBus", "LiveBus", "RedisBus", "Sender"]

log = logging.getLogger("treadle.live")
Callback = Callable[[dict[str, Any]], None]
WAKE = "wake"  # a live message: durable events up to ``seq`` were committed (SSE tails fetch)


class LiveBus(Protocol):
    """Live, unstored events (model deltas) and wake-ups for SSE tails."""

    def publish(self, run_id: str, event: dict[str, Any]) -> None: ...

    def subscribe(
        self, run_id: str, callback: Callable[[dict[str, Any]], None]
    ) -> Callable[[], None]: ...

    def flush(self, timeout: float = 5.0) -> bool: ...


class InProcessBus:
    """Embedded mode: callbacks in this process."""

    def __init__(self) -> None:
        self._subs: dict[str, list[Callable[[dict[str, Any]], None]]] = defaultdict(list)
        self._lock = threading.Lock()

    def publish(self, run_id: str, event: dict[str, Any]) -> None:
        with self._lock:
            subs = list(self._subs.get(run_id, ()))
        for cb in subs:
            try:
                cb(event)
            except Exception:  # a broken subscriber never breaks the publisher (a round)
                log.warning("live subscriber failed for %s", run_id, exc_info=True)

    def subscribe(
        self, run_id: str, callback: Callable[[dict[str, Any]], None]
    ) -> Callable[[], None]:
        with self._lock:
            self._subs[run_id].append(callback)

        def cancel() -> None:
            with self._lock:
                if callback in self._subs.get(run_id, []):
                    self._subs[run_id].remove(callback)
                    if not self._subs[run_id]:
                        del self._subs[run_id]

        return cancel

    def flush(self, timeout: float = 5.0) -> bool:
        """Nothing to send: callbacks ran in ``publish``."""
        return True


class Sender:
    """Publishes in one background thread, what has queued up in one pipelined round trip:
    a round's thread hands a wake-up or a delta over and goes on instead of waiting on Redis
    (a tool round made three such round trips on its critical path). One thread, one queue:
    a run's messages keep their order. Live messages are hints (a tail reads the durable
    events; deltas are never stored): at ``LIMIT`` queued, a new one is dropped and counted
    (``treadle_live_dropped``), as a failed publish always was."""

    LIMIT = 10_000
    BATCH = 500

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._items: deque[tuple[str, str]] = deque()
        lock = threading.Lock()
        self._queued = threading.Condition(lock)  # the sender waits on it
        self._sent = threading.Condition(lock)  # ``flush`` waits on it
        self._busy = False
        self._pid = 0

    def put(self, channel: str, data: str) -> None:
        with self._queued:
            if len(self._items) >= self.LIMIT:
                LIVE_DROPPED.inc()
                return
            self._items.append((channel, data))
            if self._pid != os.getpid():  # first use in this process (or a fork's child)
                self._pid = os.getpid()
                threading.Thread(target=self._run, daemon=True, name="treadle-live-send").start()
            self._queued.notify()

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything put so far went out (or failed); False: ``timeout`` passed."""
        with self._sent:
            return self._sent.wait_for(lambda: not self._items and not self._busy, timeout)

    def _run(self) -> None:
        while True:
            with self._queued:
                self._queued.wait_for(lambda: bool(self._items))
                n = min(len(self._items), self.BATCH)
                batch = [self._items.popleft() for _ in range(n)]
                self._busy = True
            self._send(batch)
            with self._sent:
                self._busy = False
                self._sent.notify_all()

    def _send(self, batch: list[tuple[str, str]]) -> None:
        pipe = self._client.pipeline(transaction=False)
        for channel, data in batch:
            pipe.publish(channel, data)
        try:
            pipe.execute()
        except Exception:  # whatever it was, the thread lives on for the next batch
            log.warning("live publish of %d messages failed", len(batch), exc_info=True)


class RedisBus:
    def __init__(self, url: str) -> None:
        self._pub = redis.Redis.from_url(url, socket_timeout=5)
        self._sender = Sender(self._pub)
        self._sub_client = redis.Redis.from_url(url, socket_timeout=None)
        self._subs: dict[str, list[Callback]] = defaultdict(list)
        self._lock = threading.Lock()
        self._pubsub: Any = None
        self._thread: threading.Thread | None = None

    @staticmethod
    def channel(run_id: str) -> str:
        return f"treadle:live:{run_id}"

    def publish(self, run_id: str, event: dict[str, Any]) -> None:
        """Handed to the sender thread (``Sender``): the caller does not wait on Redis."""
        self._sender.put(self.channel(run_id), json.dumps(event))

    def flush(self, timeout: float = 5.0) -> bool:
        """Everything published so far sent (tests, and a process about to exit)."""
        return self._sender.flush(timeout)

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
