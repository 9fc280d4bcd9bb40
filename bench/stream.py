"""Streaming: model delta → SSE client latency. The fake OpenAI-compatible server (in this
process) streams a reply word by word; a real worker relays each delta over Redis pub/sub;
the API (``uvicorn --factory scheduler.app:create_app``, its own process) serves
``GET /v1/runs/{id}/events``; an SSE client in this process stamps each delta on arrival.
Latency = arrival at the client - the moment the fake server handed that chunk to its HTTP
server (same clock). Baseline in the same run: a bare Redis pub/sub hop on the same Redis.

    python -m bench.stream     (BENCH_STREAM_RUNS=10, BENCH_STREAM_WORDS=40,
                                BENCH_STREAM_CHUNK_MS=20)
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import httpx

from bench.common import (
    PY,
    Procs,
    Section,
    emit,
    free_port,
    log,
    med,
    ms,
    new_prefix,
    p95,
    redis_cleanup,
    redis_client,
    scratch_db,
    start_treadle_workers,
    treadle_env,
    wait_for,
)
from shared.llm.fake_server import FakeLLMServer, ReplySpec

RUNS = int(os.environ.get("BENCH_STREAM_RUNS", "10"))
WORDS = int(os.environ.get("BENCH_STREAM_WORDS", "40"))
CHUNK = float(os.environ.get("BENCH_STREAM_CHUNK_MS", "20")) / 1000
PUBSUB_N = int(os.environ.get("BENCH_STREAM_PUBSUB", "500"))


class SendTimes:
    """ASGI middleware around the fake server: the time each streamed content piece is
    handed to the HTTP server, by its text (every word of every reply is unique)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.sent: dict[str, float] = {}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def timed_send(message: dict[str, Any]) -> None:
            body = message.get("body") if message.get("type") == "http.response.body" else None
            if body:
                now = time.time()
                for line in body.decode(errors="replace").splitlines():
                    if line.startswith("data: {"):
                        try:
                            delta = json.loads(line[6:])["choices"][0]["delta"]
                        except (ValueError, KeyError, IndexError):
                            continue
                        if delta.get("content"):
                            self.sent[delta["content"]] = now
            await send(message)

        await self.app(scope, receive, timed_send)


def responder(body: dict[str, Any]) -> ReplySpec:
    user = next(
        (m.get("content") for m in reversed(body["messages"]) if m.get("role") == "user"), "r0"
    )
    tag = str(user).split()[-1]
    text = " ".join(f"{tag}w{i:03d}" for i in range(WORDS))
    return ReplySpec(text=text, first_byte_latency=0.3, chunk_latency=CHUNK)


def sse_run(api: str, tag: str) -> tuple[str, dict[str, float], float]:
    """Submit a chat run over HTTP and read its SSE stream to the end: (run id, arrival time
    by delta text, time of run.completed)."""
    agent = {"kind": "chat", "model": {"provider": "openai", "base_url": BASE[0], "model": "f"}}
    got: dict[str, float] = {}
    done = float("nan")
    with httpx.Client(timeout=httpx.Timeout(60.0)) as client:
        run = client.post(f"{api}/v1/runs", json={"agent": agent, "input": f"stream {tag}"})
        run.raise_for_status()
        run_id = run.json()["id"]
        with client.stream("GET", f"{api}/v1/runs/{run_id}/events") as resp:
            event = ""
            for line in resp.iter_lines():
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: "):
                    now = time.time()
                    if event == "text.delta":
                        got[json.loads(line[6:])["text"]] = now
                    elif event in ("run.completed", "run.failed"):
                        done = now
                        break
    return run_id, got, done


BASE = [""]


def pubsub_baseline(n: int) -> list[float]:
    """A bare Redis pub/sub hop: PUBLISH here, a subscriber thread (own connection) stamps."""
    channel = f"bench:pubsub:{new_prefix('ps')}"
    sub = redis_client().pubsub(ignore_subscribe_messages=True)
    sub.subscribe(channel)
    lat: list[float] = []
    ready = threading.Event()

    def listen() -> None:
        ready.set()
        for msg in sub.listen():
            if msg["type"] == "message":
                now = time.time()
                sent = float(msg["data"])
                if sent < 0:
                    return
                lat.append(now - sent)

    t = threading.Thread(target=listen, daemon=True)
    t.start()
    ready.wait(5)
    time.sleep(0.2)
    pub = redis_client()
    for _ in range(n):
        pub.publish(channel, repr(time.time()))
        time.sleep(CHUNK / 4)
    pub.publish(channel, "-1")
    t.join(10)
    sub.close()
    pub.close()
    return lat


def main() -> None:
    started = time.time()
    procs = Procs()
    llm = FakeLLMServer(responder)
    times = SendTimes(llm.app)
    llm.app = times  # type: ignore[assignment]
    llm.start()
    BASE[0] = llm.base_url
    lat: list[float] = []
    first: list[float] = []
    missing = 0
    with scratch_db("stream") as url:
        prefix = new_prefix("stream")
        env = treadle_env(url, prefix)
        port = free_port()
        api = f"http://127.0.0.1:{port}"
        try:
            procs.start(
                "api",
                [
                    PY,
                    "-m",
                    "uvicorn",
                    "--factory",
                    "scheduler.app:create_app",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--log-level",
                    "warning",
                ],
                {**env, "TREADLE_AUTH": "off"},
            )
            start_treadle_workers(procs, env, 1, 8, tag="sw")
            wait_for(lambda: _healthy(api, procs), 60, "the API")
            sse_run(api, "warm")  # imports, connections, pub/sub subscription
            log(f"stream: baseline, {PUBSUB_N} bare pub/sub messages")
            base = pubsub_baseline(PUBSUB_N)
            log(f"stream: {RUNS} streamed runs of {WORDS} deltas")
            for i in range(RUNS):
                _, got, _ = sse_run(api, f"r{i}")
                for text, t_sent in times.sent.items():
                    if text.startswith(f"r{i}w"):
                        if text in got:
                            lat.append(got[text] - t_sent)
                            if text.startswith(f"r{i}w000"):
                                first.append(got[text] - t_sent)
                        else:
                            missing += 1
            base += pubsub_baseline(PUBSUB_N)
        finally:
            procs.stop_all()
            redis_cleanup(prefix)
            llm.stop()
    s = Section(
        "Model delta → SSE client",
        ["path", "deltas", "median ms", "p95 ms", "x the bare pub/sub hop (median)"],
    )
    s.row(
        "**treadle**: fake model → worker → Redis pub/sub → API → SSE client",
        len(lat),
        ms(med(lat), 2),
        ms(p95(lat), 2),
        f"**{med(lat) / med(base):.1f}**",
    )
    s.row(
        "… first delta of each run only",
        len(first),
        ms(med(first), 2),
        ms(p95(first), 2),
        f"{med(first) / med(base):.1f}",
    )
    s.row(
        "baseline: bare Redis PUBLISH → subscriber (same Redis)",
        len(base),
        ms(med(base), 3),
        ms(p95(base), 3),
        "1.0",
    )
    s.note(
        f"{RUNS} chat runs, one at a time, each streaming {WORDS} words "
        f"{CHUNK * 1000:.0f} ms apart; deltas missing at the client: {missing}. One worker "
        "`-P threads -c 8`, one API process (uvicorn, `TREADLE_AUTH=off` on loopback), "
        "the client and the fake server in the bench process (the clock they share is the "
        "one measured against)."
    )
    head = [
        [
            "model delta → SSE client (median / p95)",
            f"{ms(med(lat), 2)} / {ms(p95(lat), 2)} ms = {med(lat) / med(base):.1f}x a bare "
            "pub/sub hop",
            "",
            "",
        ]
    ]
    emit("stream", "Streaming latency", [s], started, head)


def _healthy(api: str, procs: Procs) -> bool:
    if not procs.alive("api"):
        raise RuntimeError("the API process exited:\n" + procs.log("api")[-2000:])
    try:
        return httpx.get(f"{api}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


if __name__ == "__main__":
    main()
