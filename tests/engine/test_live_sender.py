"""Live messages go out from one background thread (``shared.engine.livebus.Sender``): the
publisher does not wait on Redis, a run's messages keep their order, what queued up goes in
one pipelined round trip, and a full queue drops (and counts) instead of growing."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis

from shared.engine.livebus import RedisBus, Sender
from shared.engine.metrics import LIVE_DROPPED


class Held:
    """A Redis client whose pipelines wait for ``release`` before they send."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.release = threading.Event()
        self.sent: list[int] = []  # messages per round trip

    def pipeline(self, transaction: bool = False) -> Any:
        pipe = self.client.pipeline(transaction=transaction)
        execute, held = pipe.execute, self

        def waiting_execute(*a: Any, **kw: Any) -> Any:
            held.release.wait(10)
            held.sent.append(len(pipe.command_stack))
            return execute(*a, **kw)

        pipe.execute = waiting_execute  # type: ignore[method-assign]
        return pipe


def test_messages_of_each_run_arrive_in_order(redis_url: str) -> None:
    bus = RedisBus(redis_url)
    got: dict[str, list[int]] = {f"r{i}": [] for i in range(4)}
    done = threading.Event()

    def on(run: str) -> Any:
        def cb(event: dict[str, Any]) -> None:
            got[run].append(event["n"])
            if all(len(v) == 200 for v in got.values()):
                done.set()

        return cb

    cancels = [bus.subscribe(run, on(run)) for run in got]
    time.sleep(0.2)  # the subscriptions are in place

    def send(run: str) -> None:
        for n in range(200):
            bus.publish(run, {"type": "text.delta", "n": n})

    threads = [threading.Thread(target=send, args=(run,)) for run in got]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert bus.flush(5)
    assert done.wait(5), {k: len(v) for k, v in got.items()}
    assert all(v == list(range(200)) for v in got.values())
    for cancel in cancels:
        cancel()


def test_the_publisher_does_not_wait_and_what_queued_goes_in_one_round_trip(
    redis_url: str,
) -> None:
    held = Held(redis_url)
    sender = Sender(held)  # type: ignore[arg-type]
    started = time.perf_counter()
    for n in range(50):
        sender.put("treadle:live:x", str(n))
    assert time.perf_counter() - started < 0.5  # none of the 50 waited on the held send
    assert not sender.flush(0.2)  # the first one is still held
    held.release.set()
    assert sender.flush(5)
    assert sum(held.sent) == 50
    assert len(held.sent) <= 2  # the first message alone, then the 49 that queued behind it


def test_a_full_queue_drops_and_counts(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Sender, "LIMIT", 10)
    held = Held(redis_url)
    sender = Sender(held)  # type: ignore[arg-type]
    before = LIVE_DROPPED._value.get()
    sender.put("treadle:live:y", "0")
    time.sleep(0.1)  # the first is taken and held; ten more fill the queue
    for n in range(15):
        sender.put("treadle:live:y", str(n + 1))
    assert LIVE_DROPPED._value.get() - before == 5
    held.release.set()
    assert sender.flush(5)
    assert sum(held.sent) == 11


def test_flushing_threads_never_take_the_senders_wake_up(redis_url: str) -> None:
    """Threads flushing while others publish: every message still goes out, and ``flush``
    returns (the sender and the flushers wait on separate conditions of one lock)."""
    held = Held(redis_url)
    held.release.set()
    sender = Sender(held)  # type: ignore[arg-type]
    stop = threading.Event()

    def flushing() -> None:
        while not stop.is_set():
            sender.flush(0.05)

    flushers = [threading.Thread(target=flushing) for _ in range(3)]
    for t in flushers:
        t.start()
    for n in range(300):
        sender.put("treadle:live:z", str(n))
        if n % 10 == 0:
            time.sleep(0.002)
    assert sender.flush(5)
    stop.set()
    for t in flushers:
        t.join()
    assert sum(held.sent) == 300
