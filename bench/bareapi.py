"""The answer path, bare: an HTTP endpoint that does what an answer must (``bench.pause``'s
"the protocol, bare" row; NOT treadle). ``POST /answer/{chain}`` with a bearer key: the key
looked up by its hash (one SELECT, outside a transaction), one versioned SQL transaction (the
chain's row from version 0 to 1, a log row), then the round task sent
(``bench.floorapp.bare_round``, shape "answer": it claims, calls the fake model with the user
message ``b<chain>``, and commits).

    python -m uvicorn --factory bench.bareapi:create_app   (BENCH_FLOOR_DB,
        TREADLE_BROKER_URL, TREADLE_BROKER_PREFIX, BENCH_BARE_MODEL_URL)

Starlette on uvicorn, as treadle's API; a plain endpoint, so one hand-off to the thread pool
does the key check and the write.
"""

from __future__ import annotations

import hashlib
import os
import time

import sqlalchemy as sa
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from bench.floorapp import BARE_ROUND, INSERT, QUEUE, app, engine, reading

KEYS_DDL = "CREATE TABLE IF NOT EXISTS floor_keys (hash text PRIMARY KEY, tenant text NOT NULL)"
KEY = sa.text("SELECT tenant FROM floor_keys WHERE hash = :h")
ANSWERED = sa.text(
    "UPDATE floor_chain SET version = 1, updated_at = :ts WHERE id = :chain AND version = 0"
)


def key_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _answer(chain: int, secret: str, body: bytes) -> int:
    """The status: 401 for an unknown key, 409 for an answered chain, else 200."""
    with reading() as conn:
        if conn.execute(KEY, {"h": key_hash(secret)}).first() is None:
            return 401
    ts = time.time()
    with engine().begin() as conn:
        conn.execute(INSERT, {"chain": chain, "hop": -1, "ts": ts, "note": body.decode()})
        if conn.execute(ANSWERED, {"ts": ts, "chain": chain}).rowcount != 1:
            raise LookupError(chain)
    urls = [os.environ["BENCH_BARE_MODEL_URL"], ""]
    app.send_task(BARE_ROUND, args=[chain, 0, 0, urls, "answer"], queue=QUEUE)
    return 200


def create_app() -> Starlette:
    from starlette.concurrency import run_in_threadpool

    async def answer(request: Request) -> JSONResponse:
        secret = request.headers.get("authorization", "").removeprefix("Bearer ")
        body = await request.body()
        chain = int(request.path_params["chain"])
        try:
            status = await run_in_threadpool(_answer, chain, secret, body)
        except LookupError:
            status = 409
        return JSONResponse({"chain": chain}, status_code=status)

    return Starlette(routes=[Route("/answer/{chain}", answer, methods=["POST"])])
