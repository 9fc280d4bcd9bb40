"""Shared helpers for the benchmarks: scratch databases, worker processes, the floor, runs,
process and machine counters, and markdown tables.

Services: PostgreSQL (``BENCH_PG``, default the test server's ``test`` database, used only to
create and drop a scratch database per script) and Redis (``BENCH_REDIS``, default DB 0, which
no test uses; every key of a bench run carries a unique broker prefix and is deleted after).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from bench.services import TEXT_500
from shared.config import Settings
from shared.names import ROUNDS_QUEUE, TOOLS_QUEUE

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PY = sys.executable


def opted_in() -> list[str]:
    """The opt-ins that change the path a table measures, as ``NAME=value``: read by the
    project's own settings from this environment, which the bench's workers inherit."""
    settings = Settings()
    on = []
    if settings.worker_read_tools_in_round:
        on.append("TREADLE_WORKER_READ_TOOLS_IN_ROUND=true")
    if settings.worker_in_place_s > 0:
        on.append(f"TREADLE_WORKER_IN_PLACE_S={settings.worker_in_place_s:g}")
    return on


def reads_in_round() -> bool:
    """One read per round runs in the round's own task (opted in): one task per tool round."""
    return Settings().worker_read_tools_in_round


def opt_in_label() -> str:
    """What a table's title adds when an opt-in is set ("" when none is): its figures are
    never reported as the defaults'."""
    on = opted_in()
    return f" with {', '.join(f'`{o}`' for o in on)} (opt-in, NOT the defaults)" if on else ""


def path_name() -> str:
    """How a table names its path: the path users run, and the opt-in if one is set."""
    return f"the path users run{opt_in_label()}"


PG_ADMIN = os.environ.get("BENCH_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/0")
TAG = uuid.uuid4().hex[:8]
LOG_DIR = Path(tempfile.gettempdir()) / f"treadle-bench-{TAG}"
CLK = os.sysconf("SC_CLK_TCK")
QUEUES = f"{ROUNDS_QUEUE},{TOOLS_QUEUE}"


# --------------------------------------------------------------------------- statistics


def pct(xs: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100), linear interpolation; nan for no data."""
    if not xs:
        return math.nan
    s = sorted(xs)
    k = (len(s) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def med(xs: Sequence[float]) -> float:
    return pct(xs, 50)


def p95(xs: Sequence[float]) -> float:
    return pct(xs, 95)


def ms(x: float, digits: int = 1) -> str:
    return "n/a" if x != x else f"{x * 1000:.{digits}f}"


def num(x: float, digits: int = 2) -> str:
    return "n/a" if x != x else f"{x:,.{digits}f}"


def verdict(ok: bool) -> str:
    return "meets" if ok else "**misses**"


# --------------------------------------------------------------------------- report


@dataclass
class Section:
    title: str
    headers: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def row(self, *cells: Any) -> None:
        self.rows.append([str(c) for c in cells])

    def note(self, text: str) -> None:
        self.notes.append(text)

    def markdown(self) -> str:
        out = [f"### {self.title}", ""]
        if self.headers:
            out.append("| " + " | ".join(self.headers) + " |")
            out.append("|" + "|".join("---" for _ in self.headers) + "|")
            out += ["| " + " | ".join(r) + " |" for r in self.rows]
            out.append("")
        out += [f"{n}" for n in self.notes]
        if self.notes:
            out.append("")
        return "\n".join(out)


def emit(
    name: str,
    title: str,
    sections: list[Section],
    started: float,
    headline: list[list[str]] | None = None,
) -> str:
    """Print the script's tables; write them (``<name>.md.tmp``) and its headline rows
    (``<name>.json.tmp``: measure, value, target, verdict) for ``bench.all``."""
    wall = time.time() - started
    body = "\n".join(s.markdown() for s in sections)
    text = f"## {title}\n\n{body}\n_`python -m bench.{name}` took {wall:.0f} s._\n"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.md.tmp").write_text(text, encoding="utf-8")
    (RESULTS / f"{name}.json.tmp").write_text(json.dumps(headline or []), encoding="utf-8")
    print(text, flush=True)
    return text


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- PostgreSQL


@contextlib.contextmanager
def scratch_db(tag: str, treadle_schema: bool = True) -> Iterator[str]:
    """A fresh database (migrated to treadle's schema), dropped afterwards."""
    name = f"bench_{tag}_{TAG}"
    admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
    try:
        if treadle_schema:
            from shared.store.db import make_engine, migrate

            engine = make_engine(url)
            migrate(engine)
            engine.dispose()
        yield url
    finally:
        _drop(admin, name)


def _drop(admin: sa.Engine, name: str) -> None:
    """Drop a scratch database; a failure (PostgreSQL restarted by someone's chaos test…)
    is retried, then only reported."""
    for attempt in range(5):
        try:
            with admin.connect() as conn:
                conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            break
        except sa.exc.DBAPIError as exc:
            admin.dispose()
            if attempt == 4:
                log(f"could not drop scratch database {name}: {exc}")
            time.sleep(2)
    admin.dispose()


def db_name(url: str) -> str:
    return url.rsplit("/", 1)[-1]


def wal_lsn(conn: sa.Connection) -> int:
    """The cluster's current WAL position in bytes (all databases: other writers add noise)."""
    return int(conn.execute(sa.text("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")).scalar_one())


def table_bytes(conn: sa.Connection, tables: Sequence[str]) -> dict[str, int]:
    """pg_total_relation_size (heap + TOAST + indexes) per table."""
    return {
        t: int(
            conn.execute(
                sa.text("SELECT pg_total_relation_size(CAST(:t AS regclass))"), {"t": t}
            ).scalar_one()
        )
        for t in tables
    }


def pg_backend_cpu(conn: sa.Connection, dbname: str) -> dict[int, float]:
    """CPU seconds of each PostgreSQL backend connected to ``dbname``."""
    pids = (
        conn.execute(sa.text("SELECT pid FROM pg_stat_activity WHERE datname = :d"), {"d": dbname})
        .scalars()
        .all()
    )
    return {int(p): proc_cpu(int(p)) for p in pids}


def pg_cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    return sum(v - before.get(p, 0.0) for p, v in after.items())


# --------------------------------------------------------------------------- Redis


def redis_client() -> Any:
    import redis

    # redis-py 8 reads time out after ~5 s by default: no timeout for our long reads
    return redis.Redis.from_url(REDIS_URL, socket_timeout=None)


def new_prefix(tag: str) -> str:
    return f"bench-{tag}-{TAG}-{uuid.uuid4().hex[:4]}:"


def redis_cleanup(prefix: str) -> int:
    r = redis_client()
    keys = list(r.scan_iter(match=f"{prefix}*", count=1000))
    for i in range(0, len(keys), 500):
        r.delete(*keys[i : i + 500])
    r.close()
    return len(keys)


def queued_messages(
    prefix: str, queues: Sequence[str] = (ROUNDS_QUEUE, TOOLS_QUEUE)
) -> dict[str, int]:
    """Messages in the broker for a prefix: ready in each queue, and delivered-but-unacked."""
    r = redis_client()
    out = {q: int(r.llen(f"{prefix}{q}")) for q in queues}
    out["unacked"] = int(r.hlen(f"{prefix}unacked"))
    r.close()
    return out


# --------------------------------------------------------------------------- processes


def proc_cpu(pid: int) -> float:
    """utime + stime of a process, seconds (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK


def proc_rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return math.nan


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot (all cores)."""
    with open("/proc/stat") as fh:
        vals = [int(v) for v in fh.readline().split()[1:]]
    idle = vals[3] + vals[4]
    return (sum(vals) - idle) / CLK, sum(vals) / CLK


class Procs:
    """Subprocesses (worker, API), each in its own process group; logs under LOG_DIR."""

    def __init__(self) -> None:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, cmd: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        logf = open(LOG_DIR / f"{name}.log", "ab")  # noqa: SIM115 - lives with the process
        proc = subprocess.Popen(
            cmd,
            env={**os.environ, **env},
            cwd=ROOT,
            stdout=logf,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs[name] = proc
        return proc

    def pid(self, name: str) -> int:
        return self.procs[name].pid

    def pids(self, prefix: str = "") -> list[int]:
        return [p.pid for n, p in self.procs.items() if n.startswith(prefix)]

    def alive(self, name: str) -> bool:
        return self.procs[name].poll() is None

    def log(self, name: str) -> str:
        return (LOG_DIR / f"{name}.log").read_text(errors="replace")

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is None:
            return
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.stop(name)


def wait_for(pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = pred()
        except sa.exc.OperationalError:  # PostgreSQL restarting: poll again
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def celery_worker_cmd(app: str, name: str, concurrency: int, queues: str) -> list[str]:
    return [
        PY,
        "-m",
        "celery",
        "-A",
        app,
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
        "--loglevel=WARNING",
    ]


# --------------------------------------------------------------------------- the floor


def floor_env(
    url: str, prefix: str, events: bool = False, preping: bool = False, pool: int = 5
) -> dict[str, str]:
    return {
        "BENCH_POOL_SIZE": str(pool),
        "BENCH_FLOOR_DB": url,
        "TREADLE_BROKER_URL": REDIS_URL,
        "TREADLE_BROKER_PREFIX": prefix,
        "BENCH_FLOOR_EVENTS": "1" if events else "0",
        "BENCH_FLOOR_PREPING": "1" if preping else "0",
    }


FLOOR_DDL = [
    "CREATE TABLE IF NOT EXISTS floor_chain (id integer PRIMARY KEY, version integer NOT NULL,"
    " updated_at double precision)",
    "CREATE TABLE IF NOT EXISTS floor_log (chain integer NOT NULL, hop integer NOT NULL,"
    " started_at double precision NOT NULL, note text, PRIMARY KEY (chain, hop))",
]


@dataclass
class FloorResult:
    hop_latencies: list[float]  # seconds between consecutive hop starts of a chain
    hops: int
    span: float  # first hop start → last hop start, seconds
    worker_cpu: float  # CPU seconds of the worker processes
    starts: list[float] = field(default_factory=list)

    @property
    def hops_per_s(self) -> float:
        return self.hops / self.span if self.span > 0 else math.nan


def merge(results: Sequence[FloorResult]) -> FloorResult:
    """Blocks of the same measurement, pooled (hops/s = all hops / all spans)."""
    return FloorResult(
        [x for r in results for x in r.hop_latencies],
        sum(r.hops for r in results),
        sum(r.span for r in results),
        sum(r.worker_cpu for r in results),
    )


class Floor:
    """Floor worker processes on a scratch database, and chains of hops driven through them."""

    def __init__(
        self,
        procs: Procs,
        url: str,
        prefix: str,
        *,
        workers: int = 1,
        concurrency: int = 8,
        events: bool = False,
        preping: bool = False,
        pool: int = 5,
    ) -> None:
        """``pool``: each worker process's database pool (and as many more on overflow)."""
        from bench.floorapp import QUEUE, make_app

        self.procs, self.url, self.prefix = procs, url, prefix
        self.names = [f"floor-{uuid.uuid4().hex[:6]}" for _ in range(workers)]
        self.queue = QUEUE
        self.app = make_app(REDIS_URL, prefix, events)
        self.engine = sa.create_engine(url, pool_size=2, max_overflow=4)
        with self.engine.begin() as conn:
            for ddl in FLOOR_DDL:
                conn.execute(sa.text(ddl))
        env = floor_env(url, prefix, events, preping, pool)
        for name in self.names:
            procs.start(name, celery_worker_cmd("bench.floorapp", name, concurrency, QUEUE), env)
        self.run(chains=2, hops=3, timeout=60)  # ready and warm (imports, connections)

    def launch(self, chains: int, hops: int, sleep_even: float = 0.0) -> list[int]:
        """Start ``chains`` chains of ``hops`` hops; their chain ids."""
        ids = self.new_chains(chains)
        for i in ids:
            self.app.send_task("bench.hop", args=[i, 0, hops - 1, sleep_even], queue=self.queue)
        return ids

    def run(
        self, chains: int, hops: int, sleep_even: float = 0.0, timeout: float = 300
    ) -> FloorResult:
        cpu0 = sum(proc_cpu(p) for p in self.pids())
        ids = self.launch(chains, hops, sleep_even)
        lo, hi = ids[0], ids[-1]

        def done() -> bool:
            with self.engine.connect() as conn:
                n = conn.execute(
                    sa.text("SELECT count(*) FROM floor_log WHERE chain BETWEEN :lo AND :hi"),
                    {"lo": lo, "hi": hi},
                ).scalar_one()
            return int(n) >= chains * hops

        wait_for(
            done,
            min(timeout, 30 + chains * hops * (0.3 + sleep_even)),
            f"{chains} floor chains of {hops} hops",
            interval=0.1,
        )
        cpu = sum(proc_cpu(p) for p in self.pids()) - cpu0
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT chain, hop, started_at FROM floor_log WHERE "
                    "chain BETWEEN :lo AND :hi ORDER BY chain, hop"
                ),
                {"lo": lo, "hi": hi},
            ).all()
        lat: list[float] = []
        starts = [r[2] for r in rows]
        for a, b in zip(rows, rows[1:], strict=False):
            if a[0] == b[0]:
                lat.append(b[2] - a[2])
        return FloorResult(lat, len(rows), max(starts) - min(starts), cpu, starts)

    def launch_bare(
        self,
        chains: int,
        rounds: int,
        urls: Sequence[str],
        shape: str = "default",
        chars: int = len(TEXT_500),
    ) -> list[int]:
        """Start ``chains`` chains of ``rounds`` rounds of the round protocol, bare
        (``bench.floorapp.bare_round``; ``chars``: the tool's text, in the history too); their
        chain ids."""
        from bench.floorapp import BARE_ROUND

        ids = self.new_chains(chains)
        for i in ids:
            args = [i, 0, rounds - 1, list(urls), shape, chars]
            self.app.send_task(BARE_ROUND, args=args, queue=self.queue)
        return ids

    def new_chains(self, chains: int) -> list[int]:
        """``chains`` new chains at version 0; their ids."""
        with self.engine.begin() as conn:
            conn.execute(sa.text("LOCK TABLE floor_chain IN EXCLUSIVE MODE"))
            first = int(
                conn.execute(
                    sa.text("SELECT coalesce(max(id), -1) + 1 FROM floor_chain")
                ).scalar_one()
            )
            ids = list(range(first, first + chains))
            conn.execute(
                sa.text("INSERT INTO floor_chain (id, version) VALUES (:id, 0)"),
                [{"id": i} for i in ids],
            )
        return ids

    def bare(self, rounds: int, urls: Sequence[str], shape: str = "default") -> list[float]:
        """One chain of ``rounds`` tool rounds of the round protocol, bare
        (``bench.floorapp.bare_round``); each round's overhead in seconds, as ``bench.rounds``
        measures treadle's: the next round's claim - this one's - its model call."""
        [chain] = self.launch_bare(1, rounds, urls, shape)
        query = sa.text("SELECT started_at, note FROM floor_log WHERE chain = :c ORDER BY hop")

        def done() -> bool:
            with self.engine.connect() as conn:
                return len(conn.execute(query, {"c": chain}).all()) >= rounds

        wait_for(done, 30 + rounds * 0.5, f"a bare {shape} chain of {rounds} rounds", 0.1)
        with self.engine.connect() as conn:
            rows = conn.execute(query, {"c": chain}).all()
        return [b[0] - a[0] - float(a[1]) for a, b in zip(rows, rows[1:], strict=False)]

    def pids(self) -> list[int]:
        return [self.procs.pid(n) for n in self.names if n in self.procs.procs]

    def close(self) -> None:
        for name in self.names:
            self.procs.stop(name)
        self.engine.dispose()
        self.app.close()


# --------------------------------------------------------------------------- treadle


def treadle_env(url: str, prefix: str, **extra: str) -> dict[str, str]:
    return {
        "TREADLE_DATABASE_URL": url,
        "TREADLE_BROKER_URL": REDIS_URL,
        "TREADLE_BROKER_PREFIX": prefix,
        "TREADLE_PLUGINS": "bench.plugins",
        "TREADLE_LOG_LEVEL": "WARNING",
        "TREADLE_ALLOW_TEST_MODELS": "true",  # the quick-tool rows use the scripted model
        # the HTTP tool's endpoint is on loopback, which the SSRF guard refuses unless allowed
        "TREADLE_ALLOW_HOSTS": "127.0.0.1",
        # everything else (admission, gate, pools, in-place driving) is the user's default
        **extra,
    }


def start_treadle_workers(
    procs: Procs,
    env: dict[str, str],
    n: int,
    concurrency: int,
    tag: str = "tw",
    metrics_ports: Sequence[int] = (),
) -> list[str]:
    """``n`` worker processes; with ``metrics_ports``, each serves /metrics on its port."""
    names = [f"{tag}{i + 1}-{uuid.uuid4().hex[:4]}" for i in range(n)]
    for i, name in enumerate(names):
        extra = (
            {"TREADLE_WORKER_METRICS_PORT": str(metrics_ports[i])} if i < len(metrics_ports) else {}
        )
        procs.start(
            name, celery_worker_cmd("worker.app", name, concurrency, QUEUES), {**env, **extra}
        )
    return names


def start_api(procs: Procs, env: dict[str, str]) -> str:
    """An API process (uvicorn, as ``treadle api`` serves it) on a free loopback port; its URL
    once it answers ``/healthz``."""
    port = free_port()
    cmd = [PY, "-m", "uvicorn", "--factory", "scheduler.app:create_app", "--host", "127.0.0.1"]
    procs.start("api", [*cmd, "--port", str(port), "--log-level", "warning"], env)
    api = f"http://127.0.0.1:{port}"
    wait_for(lambda: _healthy(api), 60, "the API")
    return api


def _healthy(api: str) -> bool:
    import httpx

    try:
        return httpx.get(f"{api}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def api_key(rt: Any, tenant: str) -> dict[str, str]:
    """A new API key of ``tenant`` (default scopes), as the header a client sends."""
    from shared.store.keys import create_key

    with rt.engine.begin() as conn:
        made = create_key(conn, tenant, name="bench")
    return {"Authorization": f"Bearer {made.secret}"}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def round_outcomes(ports: Sequence[int]) -> dict[str, float]:
    """``treadle_rounds_total`` by outcome, summed over the workers' /metrics."""
    import httpx

    out: dict[str, float] = {}
    for port in ports:
        try:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        except httpx.HTTPError:
            continue
        for line in text.splitlines():
            m = re.match(r'treadle_rounds_total\{.*outcome="(\w+)".*\} ([0-9.e+]+)', line)
            if m:
                out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


def treadle_runtime(url: str, prefix: str, pool_size: int = 10) -> Any:
    """A driver-side Runtime: submits and answers through the engine's commands and publishes
    to the Redis broker, like the API does."""
    import bench.plugins  # noqa: F401  (the bench tools must be known where runs are submitted)
    from shared.celery_app import make_app
    from shared.config import Settings
    from shared.engine.runtime import Runtime
    from shared.store.db import make_engine
    from shared.wiring import CeleryPublisher

    settings = Settings(
        database_url=url,
        broker_url=REDIS_URL,
        broker_prefix=prefix,
        plugins="bench.plugins",
        allow_hosts="127.0.0.1",  # as the workers (``treadle_env``)
    )
    return Runtime(
        engine=make_engine(url, pool_size=pool_size),
        settings=settings,
        publish=CeleryPublisher(make_app(settings)),
    )


def close_runtime(rt: Any) -> None:
    rt.engine.dispose()
    with contextlib.suppress(Exception):
        rt.publish.app.close()


def retrying(fn: Callable[..., Any], *args: Any, attempts: int = 8, **kw: Any) -> Any:
    """``fn`` retried on a database connection error, as an API client would on a 5xx: the
    shared PostgreSQL is restarted now and then by another suite's chaos test."""
    for i in range(attempts):
        try:
            return fn(*args, **kw)
        except sa.exc.OperationalError:
            if i == attempts - 1:
                raise
            time.sleep(min(0.5 * 2**i, 5.0))
    raise AssertionError("unreachable")


def submit(rt: Any, agent: dict[str, Any], text: str = "go", tenant: str = "default") -> str:
    from shared.agent.spec import AgentSpec
    from shared.engine.commands import RunInput, submit_run

    spec = AgentSpec.model_validate(agent)
    row, _ = retrying(submit_run, rt, RunInput(agent=spec, input=text, tenant=tenant))
    return str(row["id"])


def scripted_quick_tool_agent(
    rounds: int, sleep: float = 0.0, name: str = "scripted", text: str = TEXT_500
) -> dict[str, Any]:
    """NOT the path users run: a tool agent on the in-process scripted model whose tool is the
    in-process ``quick`` ``bench_echo``. Reply k is one ``bench_echo`` call (id ``call_k``)
    with a ~500-char argument, after ``sleep`` seconds; the run ends on ``max_rounds`` after
    ``rounds`` tool rounds (that last round makes no model call)."""
    replies: list[dict[str, Any]] = []
    for k in range(rounds):
        reply: dict[str, Any] = {
            "tool_calls": [{"id": f"call_{k}", "name": "bench_echo", "arguments": {"text": text}}]
        }
        if sleep:
            reply["sleep"] = sleep
        replies.append(reply)
    return {
        "kind": "agent",
        "tools": ["bench_echo"],
        "max_rounds": rounds,
        "force_answer_after": 10_000,
        "model": {"provider": "scripted", "name": name, "replies": replies},
    }


def quick_tool_responder(body: dict[str, Any]) -> Any:
    """Fake-server replies for ``http_model_quick_tool_agent``: always one ``bench_echo`` call
    with a ~500-char argument, its id numbered by the assistant turns so far (stateless)."""
    from shared.llm.fake_server import ReplySpec

    n = sum(1 for m in body.get("messages") or () if m.get("role") == "assistant")
    return ReplySpec(
        tool_calls=[{"id": f"call_{n}", "name": "bench_echo", "arguments": {"text": TEXT_500}}]
    )


def http_model_quick_tool_agent(base_url: str, rounds: int) -> dict[str, Any]:
    """A tool agent on a fake OpenAI-compatible server (``quick_tool_responder``) whose tool
    is the in-process ``quick`` ``bench_echo`` (run inside the round's task; NOT the path
    users run): ``rounds`` tool rounds, then the run ends on ``max_rounds``."""
    return {
        "kind": "agent",
        "tools": ["bench_echo"],
        "max_rounds": rounds,
        "force_answer_after": 10_000,
        "model": {"provider": "openai", "base_url": base_url, "model": "fake"},
    }


def http_model_http_tool_agent(model_url: str, tool_url: str, rounds: int) -> dict[str, Any]:
    """The path users run: a tool agent on the fake model in its own process (streamed SSE
    over HTTP, ``bench.services model``) whose one tool is an inline read-only HTTP tool
    posting to ``bench.services tool`` in another process (every call a ``treadle.tool``
    task); ``rounds`` tool rounds, then the run ends on ``max_rounds``."""
    from bench.services import HTTP_TOOL_FACE

    return {
        "kind": "agent",
        "tools": [
            {
                **HTTP_TOOL_FACE,
                "read_only": True,
                "http": {"method": "POST", "url": f"{tool_url}/echo", "timeout_s": 30},
            }
        ],
        "max_rounds": rounds,
        "force_answer_after": 10_000,
        "model": {"provider": "openai", "base_url": model_url, "model": "fake"},
    }


class Outside:
    """The fake model and the HTTP tool's endpoint, each its own process (``bench.services``).
    ``latency``: seconds the model waits before its first byte."""

    def __init__(
        self,
        procs: Procs,
        latency: float = 0.0,
        text_chars: int = 480,
        script: str = "tool",
        call_log: str | None = None,
    ) -> None:
        self.procs = procs
        self.model_port, self.tool_port = free_port(), free_port()
        self.names = [f"model-{uuid.uuid4().hex[:4]}", f"tool-{uuid.uuid4().hex[:4]}"]
        svc = [PY, "-m", "bench.services"]
        procs.start(
            self.names[0],
            [*svc, "model", "--port", str(self.model_port), "--latency", str(latency)]
            + ["--text-chars", str(text_chars), "--script", script]
            + (["--call-log", call_log] if call_log else []),
            {},
        )
        procs.start(self.names[1], [*svc, "tool", "--port", str(self.tool_port)], {})
        import httpx

        for url in (f"http://127.0.0.1:{self.model_port}/healthz", f"{self.tool_url}/health"):
            wait_for(lambda u=url: _ok(httpx, u), 30, f"{url} up", interval=0.1)

    @property
    def model_url(self) -> str:
        return f"http://127.0.0.1:{self.model_port}/v1"

    @property
    def tool_url(self) -> str:
        return f"http://127.0.0.1:{self.tool_port}"

    def agent(self, rounds: int) -> dict[str, Any]:
        return http_model_http_tool_agent(self.model_url, self.tool_url, rounds)

    def pids(self) -> list[int]:
        return [self.procs.pid(n) for n in self.names if n in self.procs.procs]

    def close(self) -> None:
        for name in self.names:
            self.procs.stop(name)


def _ok(httpx: Any, url: str) -> bool:
    try:
        return bool(httpx.get(url, timeout=2).is_success)
    except httpx.HTTPError:
        return False


def count_status(engine: sa.Engine, statuses: Sequence[str]) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text("SELECT count(*) FROM runs WHERE status = ANY(:s)"), {"s": list(statuses)}
            ).scalar_one()
        )


def failed_runs(engine: sa.Engine) -> list[tuple[str, Any]]:
    with engine.connect() as conn:
        return [
            (r[0], r[1])
            for r in conn.execute(
                sa.text("SELECT id, error FROM runs WHERE status = 'failed' LIMIT 5")
            ).all()
        ]


# --------------------------------------------------------------------------- machine


def machine() -> dict[str, str]:
    cpu = "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = "?"
    with contextlib.suppress(OSError), open("/proc/meminfo") as fh:
        mem = f"{int(fh.readline().split()[1]) / 1024 / 1024:.0f} GB"
    return {
        "cores": str(os.cpu_count()),
        "cpu": cpu,
        "memory": mem,
        "kernel": os.uname().release,
        "python": sys.version.split()[0],
    }


# --------------------------------------------------------------------------- SQL probe

_LABEL = re.compile(
    r"^\s*(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+\"?(\w+)|\bFROM\s+\"?(\w+)",
    re.IGNORECASE | re.DOTALL,
)


def sql_label(statement: str) -> str:
    """``UPDATE runs``, ``SELECT messages``, ``INSERT events`` … for a statement."""
    verb = statement.split(None, 1)[0].upper() if statement.strip() else "?"
    m = _LABEL.search(statement)
    table = (m.group(1) or m.group(2)) if m else ""
    return f"{verb} {table}".strip()


@dataclass
class Probe:
    """What an engine does, in order: statements (label, seconds, rows), commits, rollbacks
    and pool checkouts (each checkout is one ``pool_pre_ping`` round trip when it is on)."""

    log: list[tuple[str, str, float, int]] = field(default_factory=list)  # kind, label, s, rows

    def attach(self, engine: sa.Engine) -> Probe:
        from sqlalchemy import event

        @event.listens_for(engine, "before_cursor_execute")
        def _before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            conn.info["bench_t0"] = time.perf_counter()

        @event.listens_for(engine, "after_cursor_execute")
        def _after(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            dt = time.perf_counter() - conn.info.pop("bench_t0", time.perf_counter())
            rows = cursor.rowcount if cursor.rowcount and cursor.rowcount > 0 else 0
            self.log.append(("stmt", sql_label(statement), dt, rows))

        @event.listens_for(engine, "commit")
        def _commit(conn: Any) -> None:
            self.log.append(("commit", "COMMIT", 0.0, 0))

        @event.listens_for(engine, "rollback")
        def _rollback(conn: Any) -> None:
            # a read on an autocommit connection (``shared.store.db.reading``) has no transaction
            # open: psycopg sends nothing for its rollback
            pg = getattr(conn.connection.dbapi_connection, "pgconn", None)
            if pg is not None and pg.transaction_status == 0:  # libpq's PQTRANS_IDLE
                self.log.append(("end", "no ROLLBACK (autocommit)", 0.0, 0))
                return
            self.log.append(("rollback", "ROLLBACK", 0.0, 0))

        @event.listens_for(engine, "checkout")
        def _checkout(*args: Any) -> None:
            self.log.append(("checkout", "checkout", 0.0, 0))

        return self

    def mark(self) -> int:
        return len(self.log)

    def summary(self, a: int, b: int) -> dict[str, float]:
        part = self.log[a:b]
        stmts = [e for e in part if e[0] == "stmt"]
        return {
            "statements": len(stmts),
            "commits": sum(1 for e in part if e[0] == "commit"),
            "rollbacks": sum(1 for e in part if e[0] == "rollback"),
            "checkouts": sum(1 for e in part if e[0] == "checkout"),
            "sql_s": sum(e[2] for e in stmts),
            "rows": sum(e[3] for e in stmts if e[1].startswith(("SELECT", "UPDATE"))),
        }

    def transactions(self, a: int, b: int) -> list[list[str]]:
        """The statements of [a, b), grouped by transaction."""
        out: list[list[str]] = [[]]
        for kind, label, _, _ in self.log[a:b]:
            if kind == "stmt":
                out[-1].append(label)
            elif kind in ("commit", "rollback", "end") and out[-1]:
                out[-1].append(label)
                out.append([])
        return [t for t in out if t]
