"""A worker on another host loses its network mid-round and mid-write, longer than its lease,
then gets it back.

The worker runs in its own network namespace, joined to this one by a veth pair; it reaches
PostgreSQL, Redis and the write endpoint through relays listening on this side's veth
address. Cutting the link (``ip link set ... down``) is a real partition: packets are
dropped, nothing is closed. Checks: the other worker takes the runs over within the target,
never parks behind the cut worker's locks, and when the link comes back the cut worker's
late commits are refused; each write applies once, each round commits once.

Needs ``ip netns`` (root, or CAP_NET_ADMIN): in CI a failure without it, elsewhere a skip.
"""

from __future__ import annotations

import contextlib
import re
import socket
import socketserver
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from scheduler.app import create_app
from scheduler.embedded import ReaperLoop
from shared.config import Settings
from shared.engine.runtime import Runtime
from shared.store.tables import events, tool_calls, usage
from tests.loopback import LoopbackTCPServer
from tests.support import (
    IN_CI,
    EffectServer,
    WorkerProcs,
    longest_stalls,
    record_agent,
    wait_completed,
    wait_for,
)

RUNS = 8
TARGET_S = 20.0
CUT_S = 16.0  # longer than the lease (10 s)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@dataclass
class Link:
    ns: str
    outside: str  # this side's veth and its address
    here: str

    def cut(self) -> None:
        _ip("link", "set", self.outside, "down")

    def restore(self) -> None:
        _ip("link", "set", self.outside, "up")


@pytest.fixture
def link() -> Iterator[Link]:
    tag = uuid.uuid4().hex[:6]
    ns, outside, inside = f"tn{tag}", f"tv{tag}a", f"tv{tag}b"
    octet = 100 + int(tag[:2], 16) % 100
    here, there = f"10.231.{octet}.1", f"10.231.{octet}.2"
    try:
        _ip("netns", "add", ns)
    except (OSError, subprocess.CalledProcessError) as exc:
        if IN_CI:  # CI runs as root: a partition test that cannot partition must fail
            raise AssertionError(f"network namespaces are needed in CI ({exc})") from exc
        pytest.skip(f"network namespaces are not available here ({exc})")
    try:
        _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        _ip("link", "set", inside, "netns", ns)
        _ip("addr", "add", f"{here}/30", "dev", outside)
        _ip("link", "set", outside, "up")
        _ip("netns", "exec", ns, "ip", "addr", "add", f"{there}/30", "dev", inside)
        _ip("netns", "exec", ns, "ip", "link", "set", inside, "up")
        _ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")
        yield Link(ns, outside, here)
    finally:
        subprocess.run(["ip", "link", "del", outside], capture_output=True, timeout=10)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)


class Relay:
    """Forwards TCP connections from ``host:<port>`` to ``127.0.0.1:target``."""

    def __init__(self, host: str, target: int) -> None:
        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                upstream = socket.create_connection(("127.0.0.1", target))
                down: socket.socket = self.request
                pump = threading.Thread(target=_pipe, args=(upstream, down), daemon=True)
                pump.start()
                _pipe(down, upstream)
                pump.join(5)

        self.server = LoopbackTCPServer((host, 0), Handler)
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := src.recv(65536):
            dst.sendall(data)
    for s in (src, dst):
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def fast_recovery() -> dict[str, str]:
    return {"TREADLE_REDRIVE_SECONDS": str(Settings().redrive_seconds)}  # the default


@pytest.fixture
def effects() -> Iterator[EffectServer]:
    with EffectServer(delay=1.0) as server:
        yield server


def _timeline(rt: Runtime, run_id: str, cut_at: float) -> list[tuple[float, str, Any]]:
    """A run's events, in seconds from the cut (for a failure's message)."""
    offset = time.time() - time.monotonic()
    with rt.engine.connect() as conn:
        rows = conn.execute(
            sa.select(events.c.created_at, events.c.type, events.c.data)
            .where(events.c.run_id == run_id)
            .order_by(events.c.seq)
        ).all()
    return [(round(t - offset - cut_at, 1), k, d) for t, k, d in rows]


def test_a_partitioned_worker_is_taken_over_and_its_late_commits_lose(
    prod_rt: Runtime, workers: WorkerProcs, effects: EffectServer, link: Link, pg_url: str
) -> None:
    pg, redis_url = urlsplit(pg_url), urlsplit(prod_rt.settings.broker_url)
    relays = [
        Relay(link.here, pg.port or 5432),
        Relay(link.here, redis_url.port or 6379),
        Relay(link.here, effects.port),
    ]
    pg_relay, redis_relay, effect_relay = relays
    endpoint = f"http://{link.here}:{effect_relay.port}"
    allow = f"{link.here}:{effect_relay.port}"
    far_env = {
        "TREADLE_DATABASE_URL": pg_url.replace(
            pg.netloc, f"{pg.username}@{link.here}:{pg_relay.port}"
        ),
        "TREADLE_BROKER_URL": prod_rt.settings.broker_url.replace(
            redis_url.netloc, f"{link.here}:{redis_relay.port}"
        ),
        "TREADLE_ALLOW_HOSTS": allow,
    }
    rt = prod_rt
    reaper = ReaperLoop(rt, Settings().reaper_interval).start()
    try:
        far = workers.start(
            "far", concurrency=8, prefix=("ip", "netns", "exec", link.ns), env=far_env, wait=False
        )
        near = workers.start("near", concurrency=8, env={"TREADLE_ALLOW_HOSTS": allow})
        workers.ready(far)  # both booted side by side
        far_id = f"%:{workers.procs[far].pid}:%"

        def far_writing() -> int:
            with rt.engine.connect() as conn:
                return int(
                    conn.execute(
                        sa.select(sa.func.count())
                        .select_from(tool_calls)
                        .where(tool_calls.c.status == "running")
                        .where(tool_calls.c.lease_owner.like(far_id))
                    ).scalar_one()
                )

        with TestClient(create_app(lambda: rt)) as client:
            ids = [
                client.post(
                    "/v1/runs", json={"agent": record_agent(i, endpoint, "ab", 2.5), "input": "go"}
                ).json()["id"]
                for i in range(RUNS)
            ]
            wait_for(far_writing, 30, interval=0.02, what="the far worker mid-write")
            link.cut()  # mid-write (and mid-round for the other runs it holds)
            cut_at = time.monotonic()
            try:
                wait_completed(
                    client, ids, 90, "every run completed while the far worker is cut off"
                )
                time.sleep(max(0.0, cut_at + CUT_S - time.monotonic()))
            finally:
                link.restore()
            time.sleep(8.0)  # the far worker's late commits arrive, and must lose
    finally:
        reaper.stop()
        for relay in relays:
            relay.close()
    stalls = list(longest_stalls(rt.engine, ids).values())
    pattern = r"treadle\.tool\[[^]]+\] succeeded in ([0-9.]+)s"
    took = [float(x) for x in re.findall(pattern, workers.log(near))]
    drops = workers.log(near).count("held elsewhere")
    refused = workers.log(far).count("\n")
    with rt.engine.connect() as conn:
        committed = conn.execute(
            sa.select(sa.func.count())
            .select_from(usage)
            .where(usage.c.run_id.in_(ids), usage.c.committed.is_(True))
        ).scalar_one()
    print(
        f"\npartition: runs={RUNS} cut={CUT_S:.0f}s max_stall={max(stalls):.1f}s "
        f"near_slowest_tool_task={max(took, default=0):.1f}s "
        f"tool_requests={sum(effects.hits.values())} near_drops_on_held_rows={drops} "
        f"far_log_lines={refused}"
    )
    worst = ids[stalls.index(max(stalls))]
    for t, kind, data in _timeline(rt, worst, cut_at):  # the slowest run, from the cut
        print(f"  {t:+6.1f}s {kind} {data.get('call_id') or data.get('round') or ''}")
    assert max(stalls) <= TARGET_S, sorted(stalls)
    # never parked behind the cut worker's locks (a write takes 1 s at the endpoint)
    assert max(took, default=0.0) < 8.0  # lock_timeout (5 s) + the write, at worst
    assert len(effects.effects) == 2 * RUNS and set(effects.effects.values()) == {1}
    assert committed == 3 * RUNS  # each round once: the far worker's late commits lost
