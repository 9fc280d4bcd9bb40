"""Shared test helpers: service URLs, real Celery worker processes, waiting on runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shared.llm.fake_server import FakeLLMServer, ReplySpec
from shared.names import ALL_QUEUES

ROOT = Path(__file__).resolve().parents[1]
IN_CI = bool(os.environ.get("CI"))
PG_ADMIN = os.environ.get("TREADLE_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REDIS_BASE = os.environ.get("TREADLE_TEST_REDIS", "redis://127.0.0.1:6379")
# a round a worker's log says it finished: a round task (Celery's line) or a round the worker
# drove in place after a commit of its own (``worker.tasks``' line)
ROUND_DONE = r"(?:Task treadle\.round\[[^]]+\] succeeded|round \S+ v\d+ driven in place)"


def quick_recovery(allow_hosts: str | None = None, **more: str) -> dict[str, str]:
    """The settings of a crash test's workers: short leases and re-drives (a killed worker's
    work is taken over within seconds); ``allow_hosts``: the test's loopback endpoint."""
    env = {"TREADLE_LEASE_SECONDS": "3", "TREADLE_REDRIVE_SECONDS": "2", **more}
    if allow_hosts is not None:
        env["TREADLE_ALLOW_HOSTS"] = allow_hosts
    return env


def api_routes(app: Any) -> list[Any]:
    """The app's API routes as FastAPI serves them (``fastapi.routing.RouteContext``: the full
    ``path``, the effective ``dependant``, the ``original_route``), through included routers:
    ``app.routes`` itself holds the routers, not their routes."""
    from fastapi.routing import APIRoute, iter_route_contexts

    return [c for c in iter_route_contexts(app.routes) if isinstance(c.original_route, APIRoute)]


def knob(name: str, full: float, ci: float) -> float:
    """A test's size: the environment variable ``name`` when set, else ``ci`` under CI=true
    (a loaded machine; the same checks on a smaller load) and ``full`` elsewhere."""
    value = os.environ.get(name)
    if value:
        return float(value)
    return ci if IN_CI else full


def need_service(name: str, exc: BaseException) -> None:
    """In CI a missing service fails the run; locally the test skips with a message."""
    msg = f"{name} is not reachable ({type(exc).__name__}: {exc}); start it (see README)"
    if IN_CI:
        pytest.fail(msg)
    pytest.skip(msg)


def wait_for(
    pred: Callable[[], Any], timeout: float = 30.0, interval: float = 0.05, what: str = "condition"
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


class WorkerProcs:
    """Real ``celery worker`` processes (threads pool), each in its own process group."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env = env
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(
        self,
        name: str | None = None,
        concurrency: int = 8,
        queues: str = ",".join(ALL_QUEUES),
        *,
        prefix: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        wait: bool = True,
    ) -> str:
        """``prefix``: a command the worker runs under (``ip netns exec NS``); ``env``: more
        variables for this worker alone; ``wait=False``: return at once (``ready`` waits)."""
        name = name or f"w{len(self.procs) + 1}-{uuid.uuid4().hex[:4]}"
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        cmd = [
            *prefix,
            sys.executable,
            "-m",
            "celery",
            "-A",
            "worker.app",
            "worker",
            "-P",
            "threads",
            "-c",
            str(concurrency),
            "--without-mingle",
            "--without-gossip",
            "-Q",
            queues,
            "-n",
            f"{name}@%h",
            "--loglevel=INFO",
        ]
        self.procs[name] = subprocess.Popen(
            cmd,
            env={**os.environ, **self.env, **(env or {})},
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        if wait:
            self.ready(name)
        return name

    def ready(self, name: str) -> None:
        wait_for(
            lambda: b"ready" in (self.log_dir / f"{name}.log").read_bytes(),
            30,
            what=f"worker {name} ready",
        )

    def start_many(self, names: list[str | None], concurrency: int = 8) -> list[str]:
        """Start the workers side by side, then wait until every one is ready: their boots
        (imports, mostly) overlap instead of following one another."""
        started = [self.start(n, concurrency, wait=False) for n in names]
        for name in started:
            self.ready(name)
        return started

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.pop(name)
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.kill(name, signal.SIGKILL)

    def log(self, name: str) -> str:
        return (self.log_dir / f"{name}.log").read_text(errors="replace")


def model_calls(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


class EffectServer:
    """A write endpoint that, like a well-behaved API, applies each Idempotency-Key once and
    replays the stored response for repeats. ``effects[key]`` counts applied effects (must be
    1); ``hits[key]`` counts requests (may be more after crashes)."""

    def __init__(self, delay: float = 0.0) -> None:
        import json
        import threading
        from http.server import BaseHTTPRequestHandler

        from tests.loopback import LoopbackServer

        self.delay = delay
        self.effects: dict[str, int] = {}
        self.hits: dict[str, int] = {}
        self.responses: dict[str, bytes] = {}
        self.received = threading.Event()
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length)
                if len(body) < length:  # the sender died mid-request: not a request at all
                    self.close_connection = True  # (an idempotent store keeps nothing of it)
                    return
                key = self.headers.get("Idempotency-Key") or "(none)"
                with lock:
                    outer.hits[key] = outer.hits.get(key, 0) + 1
                outer.received.set()
                if outer.delay:
                    time.sleep(outer.delay)
                with lock:
                    if key not in outer.responses:
                        outer.effects[key] = outer.effects.get(key, 0) + 1
                        item = json.loads(body or b"{}").get("item")
                        outer.responses[key] = json.dumps({"recorded": item}).encode()
                    payload = outer.responses[key]
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self._server = LoopbackServer(("127.0.0.1", 0), Handler)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> EffectServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


class RoundsModel:
    """A fake server's responder: a model that calls ``echo`` each round until ``rounds``,
    then answers (``ask_at``: asks in that round instead); ``down`` makes it answer 500 from
    round ``down_from`` on (or always, when ``down_from`` is None)."""

    def __init__(self, rounds: int, *, ask_at: int | None = None) -> None:
        self.rounds, self.ask_at = rounds, ask_at
        self.down = False
        self.down_from: int | None = None
        self.lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> ReplySpec:
        k = 1 + sum(1 for m in body["messages"] if m["role"] == "assistant")
        with self.lock:
            if self.down and (self.down_from is None or k >= self.down_from):
                return ReplySpec(status=500, body={"error": {"message": "provider down"}})
        if k == self.ask_at:
            question = {"question": "Which?", "options": ["red", "blue"]}
            return ReplySpec(
                tool_calls=[{"id": f"ask{k}", "name": "ask_user", "arguments": question}]
            )
        if k < self.rounds:
            return ReplySpec(
                tool_calls=[{"id": f"c{k}", "name": "echo", "arguments": {"text": f"step {k}"}}]
            )
        return ReplySpec(text=f"done after {k} rounds")


def requests_per_round(llm: FakeLLMServer) -> dict[int, int]:
    """Requests the server got for each round (1 + the assistant messages they carry)."""
    out: dict[int, int] = {}
    for body in llm.bodies:
        k = 1 + sum(1 for m in body["messages"] if m["role"] == "assistant")
        out[k] = out.get(k, 0) + 1
    return out


def references(rt: Any, ids: set[str]) -> dict[str, int]:
    """Rows in any table whose any column names one of ``ids`` (text columns compared, JSON
    and other columns searched as text)."""
    import sqlalchemy as sa

    from shared.store.tables import metadata

    found: dict[str, int] = {}
    with rt.engine.connect() as conn:
        present = set(sa.inspect(conn).get_table_names())
        for table in metadata.sorted_tables:
            if table.name not in present:
                continue
            for col in table.columns:
                text = sa.cast(col, sa.Text)
                cond = sa.or_(*(text.like(f"%{i}%") for i in ids))
                n = conn.execute(sa.select(sa.func.count()).select_from(table).where(cond))
                if (count := int(n.scalar_one())) > 0:
                    found[f"{table.name}.{col.name}"] = count
    return found


def record_tool(url: str) -> dict[str, Any]:
    """An inline write tool that POSTs ``{"item": ...}`` to ``<url>/record`` (an
    ``EffectServer``): each call's effect is counted by its Idempotency-Key."""
    return {
        "name": "record",
        "description": "Record an item.",
        "read_only": False,
        "parameters": {
            "type": "object",
            "properties": {"item": {"type": "string"}},
            "required": ["item"],
        },
        "http": {"method": "POST", "url": f"{url}/record"},
    }


def record_agent(i: int, url: str, calls: str, sleep: float) -> dict[str, Any]:
    """A scripted agent whose rounds each record one item (``calls``: the call ids, one
    round each), each model reply taking ``sleep`` s; it answers ``run <i> done``."""
    replies: list[dict[str, Any]] = [
        {
            "sleep": sleep,
            "text": "",
            "tool_calls": [{"id": c, "name": "record", "arguments": {"item": f"{i}-{c}"}}],
        }
        for c in calls
    ]
    replies.append({"sleep": sleep, "text": f"run {i} done"})
    return {
        "kind": "agent",
        "tools": [record_tool(url)],
        "model": {"provider": "scripted", "replies": replies},
    }


def longest_stalls(engine: Any, ids: list[str]) -> dict[str, float]:
    """Per run: the longest pause between consecutive events (created → its last event)."""
    import sqlalchemy as sa

    from shared.store.tables import events, runs

    out: dict[str, float] = {}
    with engine.connect() as conn:
        for run_id in ids:
            created = conn.execute(sa.select(runs.c.created_at).where(runs.c.id == run_id))
            times = conn.execute(sa.select(events.c.created_at).where(events.c.run_id == run_id))
            stamps = sorted([float(created.scalar_one()), *(float(t) for t in times.scalars())])
            out[run_id] = max(b - a for a, b in zip(stamps, stamps[1:], strict=False))
    return out


FUZZ_TALLY_ENV = "TREADLE_FUZZ_TALLY"
"""A folder where each process that ran the fuzz (tests/security/test_fuzz.py) leaves its
figures; the session's summary line adds them up (``fuzz_summary``)."""


def fuzz_summary(folder: Path) -> str | None:
    """The schemathesis summary line of every process that fuzzed, or None."""
    import json

    parts = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    if not parts:
        return None
    ops = {op for p in parts for op in p["operations"]}

    def total(key: str) -> int:
        return sum(int(p.get(key, 0)) for p in parts)

    return (
        f"schemathesis: {len(ops)} operations, {total('cases')} cases "
        f"({total('rejected')} rejected with 4xx), {total('5xx')} server errors, "
        f"{total('failures')} failed checks, {max(int(p['seconds']) for p in parts)}s"
    )


def wait_completed(client: Any, ids: list[str], seconds: float, what: str) -> None:
    """Wait until every run in ``ids`` is ``completed`` (``client``: the API's TestClient)."""
    wait_for(
        lambda: all(client.get(f"/v1/runs/{r}").json()["status"] == "completed" for r in ids),
        seconds,
        interval=0.5,
        what=what,
    )
