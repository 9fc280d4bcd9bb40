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


# --- the round protocol, bare -----------------------------------------------------------------
# What a tool round of treadle's default shape costs with no engine: raw Celery tasks doing the
# same round trips (``bench.rounds`` "the protocol, bare" rows). One round of a chain:
#   bench.bare_round: claim txn · the model call (streamed SSE over HTTP, the history so far)
#                     · commit txn · send bench.bare_tool
#   bench.bare_tool:  read · claim txn · the tool call (HTTP POST) · commit txn · send the next
#                     bench.bare_round
# ``shape`` drops pieces to price them: "fold" = the tool task's claim folded into its commit
# (no read, no claim); "in_round" = the tool call made in the round task (one hop a round);
# "answer" = the round an answer queued (``bench.bareapi``), then the chain ends.
# floor_log gets one row per round: started_at = the round's claim, note = its model call (s).

BARE_ROUND, BARE_TOOL = "bench.bare_round", "bench.bare_tool"
BARE_TEXT = ("The quick brown fox jumps over the lazy dog; " * 12)[:480]
CLAIM = sa.text(
    "UPDATE floor_chain SET version = version + 1, updated_at = :ts "
    "WHERE id = :chain AND version = :v RETURNING version"
)
READ = sa.text("SELECT version, updated_at FROM floor_chain WHERE id = :chain")
_http: Any = None


def reading() -> sa.Connection:
    """A read outside a transaction, as treadle reads (``shared.store.db.reading``): no
    ``BEGIN``, and no ``ROLLBACK`` when the connection goes back to the pool."""
    return engine().connect().execution_options(isolation_level="AUTOCOMMIT")


def _client() -> Any:
    global _http
    if _http is None:
        import httpx

        _http = httpx.Client(timeout=30, limits=httpx.Limits(max_connections=64))
    return _http


def _claimed(chain: int, v: int) -> None:
    with engine().begin() as conn:
        conn.execute(CLAIM, {"ts": time.time(), "chain": chain, "v": v}).one()


def _committed(chain: int, v: int, hop_no: int, ts: float, note: str | None) -> None:
    with engine().begin() as conn:
        if note is not None:
            conn.execute(INSERT, {"chain": chain, "hop": hop_no, "ts": ts, "note": note})
        conn.execute(UPDATE, {"ts": time.time(), "chain": chain, "v": v})


def _model_call(model_url: str, n: int, content: str = "go") -> float:
    """The fake model's reply to the history of ``n`` tool rounds, streamed and parsed as the
    engine's client does (httpx + httpx-sse, a JSON parse per event); its seconds."""
    import json

    from httpx_sse import connect_sse

    messages: list[dict[str, Any]] = [{"role": "user", "content": content}]
    for i in range(n):
        args = json.dumps({"text": BARE_TEXT})
        call = {"id": f"call_{i}", "type": "function"}
        call["function"] = {"name": "http_echo", "arguments": args}  # type: ignore[assignment]
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": BARE_TEXT})
    body = {"model": "fake", "stream": True, "messages": messages, "tools": [_TOOL_SPEC]}
    t0 = time.time()
    with connect_sse(_client(), "POST", f"{model_url}/chat/completions", json=body) as src:
        for sse in src.iter_sse():
            if sse.data != "[DONE]":
                json.loads(sse.data)
    return time.time() - t0


_TOOL_SPEC = {
    "type": "function",
    "function": {
        "name": "http_echo",
        "description": "Echo the text back.",
        "parameters": {
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        },
    },
}


def _tool_call(tool_url: str) -> None:
    _client().post(f"{tool_url}/echo", json={"text": BARE_TEXT}).raise_for_status()


@app.task(name=BARE_ROUND, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def bare_round(chain: int, n: int, last: int, urls: list[str], shape: str) -> None:
    """Round ``n`` of ``chain`` (version 4n on entry with a tool task, 2n with ``in_round``)."""
    model_url, tool_url = urls
    if shape == "answer":  # the round an answer queued (``bench.bareapi``): claim, call, commit
        _claimed(chain, 1)
        model_s = _model_call(model_url, 0, f"b{chain}")
        _committed(chain, 2, 0, time.time(), f"{model_s:.6f}")
        return
    per = 2 if shape == "in_round" else 4 if shape == "default" else 3
    v = per * n
    ts = time.time()
    _claimed(chain, v)
    model_s = _model_call(model_url, n)
    if shape == "in_round":
        _tool_call(tool_url)
        _committed(chain, v + 1, n, ts, f"{model_s:.6f}")
        if n < last:
            bare_round.apply_async((chain, n + 1, last, urls, shape), queue=QUEUE)
        return
    _committed(chain, v + 1, n, ts, f"{model_s:.6f}")
    bare_tool.apply_async((chain, n, last, urls, shape), queue=QUEUE)


@app.task(name=BARE_TOOL, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def bare_tool(chain: int, n: int, last: int, urls: list[str], shape: str) -> None:
    _model_url, tool_url = urls
    if shape == "default":
        v = 4 * n + 2
        with reading() as conn:
            conn.execute(READ, {"chain": chain}).one()
        _claimed(chain, v)
        _tool_call(tool_url)
        _committed(chain, v + 1, n, 0.0, None)
    else:  # "fold": the claim folded into the commit
        _tool_call(tool_url)
        _committed(chain, 3 * n + 2, n, 0.0, None)
    if n < last:
        bare_round.apply_async((chain, n + 1, last, urls, shape), queue=QUEUE)
