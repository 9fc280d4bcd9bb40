"""The floor: a tiny Celery app whose only task is one hop of a chain. Each hop does one small
versioned SQL transaction (INSERT a log row + ``UPDATE … WHERE version = v``) and sends the
next hop. Same broker, same Redis transport options and task options as treadle's worker.

``celery -A bench.floorapp worker -P threads -Q bench.floor`` with ``BENCH_FLOOR_DB`` (the
SQLAlchemy URL), ``TREADLE_BROKER_URL`` and ``TREADLE_BROKER_PREFIX``. ``BENCH_FLOOR_EVENTS=1``
turns on Celery task events as treadle's config does; ``BENCH_FLOOR_PREPING=1`` uses
``pool_pre_ping`` as treadle's engine does (both off: the raw floor).
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import sqlalchemy as sa
from celery import Celery
from httpx_sse import connect_sse

from bench.services import HTTP_TOOL, HTTP_TOOL_FACE, TEXT_500

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


# --- the round protocol, bare -----------------------------------------------------------------
# What a tool round of treadle's default shape costs with no engine: raw Celery tasks doing the
# same round trips (``bench.rounds`` "the protocol, bare" rows). One round of a chain:
#   bench.bare_round: claim txn · the model call (streamed SSE over HTTP, the history so far)
#                     · commit txn (one statement) · send bench.bare_tool
#   bench.bare_tool:  read (no transaction) · the tool call (HTTP POST) in a kept thread while
#                     the claim txn commits (as treadle runs a read-only call) · commit txn ·
#                     send the next bench.bare_round
# ``shape`` drops pieces to price them: "fold" = the tool task's claim folded into its commit
# (no read, no claim); "in_round" = the tool call made in the round task (one hop a round);
# "answer" = the round an answer queued (``bench.bareapi``), then the chain ends.
# floor_log gets one row per round, written by its commit: started_at = when the round task
# began its claim (for "answer": when the round committed), note = its model call in seconds,
# cut to whole milliseconds as treadle's ``usage.latency_ms`` is.

BARE_ROUND, BARE_TOOL = "bench.bare_round", "bench.bare_tool"
PER_ROUND = {"default": 4, "fold": 3, "in_round": 2}  # versions a round moves the chain on
CLAIM = sa.text(
    "UPDATE floor_chain SET version = version + 1, updated_at = :ts "
    "WHERE id = :chain AND version = :v RETURNING version"
)
COMMIT_ROUND = sa.text(
    "WITH u AS (UPDATE floor_chain SET version = version + 1, updated_at = :ts "
    "WHERE id = :chain AND version = :v RETURNING id) "
    "INSERT INTO floor_log (chain, hop, started_at, note) SELECT id, :hop, :started, :note FROM u"
)
READ = sa.text("SELECT version, updated_at FROM floor_chain WHERE id = :chain")
TOOL_SPEC = {"type": "function", "function": HTTP_TOOL_FACE}  # as the engine sends it
BARE_TASK: dict[str, Any] = {
    "acks_late": True,
    "reject_on_worker_lost": True,
    "ignore_result": True,
    "autoretry_for": (sa.exc.OperationalError,),  # like ``hop``: retry soon
    "default_retry_delay": 0.5,
    "max_retries": 20,
}
_http: httpx.Client | None = None
_kept = ThreadPoolExecutor(64, thread_name_prefix="bare-tool")


def reading() -> sa.Connection:
    """A read outside a transaction, as treadle reads (``shared.store.db.reading``): no
    ``BEGIN``, and no ``ROLLBACK`` when the connection goes back to the pool."""
    return engine().connect().execution_options(isolation_level="AUTOCOMMIT")


def _client() -> httpx.Client:
    global _http
    if _http is None:
        _http = httpx.Client(timeout=30, limits=httpx.Limits(max_connections=64))
    return _http


def _claimed(chain: int, v: int) -> None:
    with engine().begin() as conn:
        conn.execute(CLAIM, {"ts": time.time(), "chain": chain, "v": v}).one()


def _round_committed(chain: int, v: int, n: int, started: float, model_s: float) -> None:
    """The round's commit, one statement: the chain moved on from ``v``, the round's row."""
    params = {"ts": time.time(), "chain": chain, "v": v, "hop": n, "started": started}
    with engine().begin() as conn:
        if conn.execute(COMMIT_ROUND, {**params, "note": f"{model_s:.3f}"}).rowcount != 1:
            raise LookupError(f"chain {chain} is not at version {v}")


def _tool_committed(chain: int, v: int) -> None:
    with engine().begin() as conn:
        if conn.execute(UPDATE, {"ts": time.time(), "chain": chain, "v": v}).rowcount != 1:
            raise LookupError(f"chain {chain} is not at version {v}")


def _model_call(model_url: str, n: int, text: str, content: str = "go") -> float:
    """The fake model's reply to the history of ``n`` tool rounds, streamed and parsed as the
    engine's client does (httpx + httpx-sse, a JSON parse per event); its seconds, cut to whole
    milliseconds as treadle records a call's latency."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": content}]
    for i in range(n):
        function = {"name": HTTP_TOOL, "arguments": json.dumps({"text": text})}
        call = {"id": f"call_{i}", "type": "function", "function": function}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": text})
    body = {"model": "fake", "stream": True, "messages": messages, "tools": [TOOL_SPEC]}
    t0 = time.time()
    with connect_sse(_client(), "POST", f"{model_url}/chat/completions", json=body) as src:
        for sse in src.iter_sse():
            if sse.data != "[DONE]":
                json.loads(sse.data)
    return int((time.time() - t0) * 1000) / 1000


def _tool_call(tool_url: str, text: str) -> None:
    _client().post(f"{tool_url}/echo", json={"text": text}).raise_for_status()


@app.task(name=BARE_ROUND, **BARE_TASK)
def bare_round(
    chain: int, n: int, last: int, urls: list[str], shape: str, chars: int = len(TEXT_500)
) -> None:
    """Round ``n`` of ``chain``: the chain is at version ``PER_ROUND[shape] * n`` on entry
    (1 for "answer", which ``bench.bareapi`` moved on from 0)."""
    model_url, tool_url = urls
    text = (TEXT_500 * 10)[:chars]
    if shape == "answer":
        _claimed(chain, 1)
        model_s = _model_call(model_url, 0, text, f"b{chain}")
        _round_committed(chain, 2, 0, time.time(), model_s)
        return
    v = PER_ROUND[shape] * n
    started = time.time()
    _claimed(chain, v)
    model_s = _model_call(model_url, n, text)
    if shape == "in_round":
        _tool_call(tool_url, text)
    _round_committed(chain, v + 1, n, started, model_s)
    args = (chain, n + 1 if shape == "in_round" else n, last, urls, shape, chars)
    if shape != "in_round":
        bare_tool.apply_async(args, queue=QUEUE)
    elif n < last:
        bare_round.apply_async(args, queue=QUEUE)


@app.task(name=BARE_TOOL, **BARE_TASK)
def bare_tool(chain: int, n: int, last: int, urls: list[str], shape: str, chars: int) -> None:
    """The tool task of round ``n`` (the chain at version ``PER_ROUND[shape] * n + 2``), then
    round ``n + 1``."""
    tool_url, text = urls[1], (TEXT_500 * 10)[:chars]
    v = PER_ROUND[shape] * n + 2
    if shape == "default":
        with reading() as conn:
            conn.execute(READ, {"chain": chain}).one()
        call = _kept.submit(_tool_call, tool_url, text)
        _claimed(chain, v)
        call.result()
        _tool_committed(chain, v + 1)
    else:  # "fold": the claim folded into the commit
        _tool_call(tool_url, text)
        _tool_committed(chain, v)
    if n < last:
        bare_round.apply_async((chain, n + 1, last, urls, shape, chars), queue=QUEUE)
