"""Pauses: N runs waiting on an ``ask_user`` question hold nothing. Queued broker messages
(must be 0), worker RSS (must not grow with the number waiting), database bytes per waiting
run; then every run is answered: answer → next model request latency, paced one at a time
(against the floor hop measured in the same run) and all at once.

Runs are submitted straight through ``shared.engine.commands.submit_run`` (4 threads, no
HTTP). They are answered, by default, the way users answer: ``POST /v1/runs/{id}/answer`` with
an API key, to an API process (uvicorn, default settings: auth required) over HTTP, one
keep-alive client per answering thread. ``BENCH_PAUSE_ANSWER=call`` calls ``answer_run`` (what
the API handler calls) in the bench's process instead (NOT the path users run: no HTTP, no
key check; it counts the answer's statements). The model is, by
default, the path users run: the fake model in its own process over HTTP (``bench.services
model --script ask``: reply 1 asks, reply 2 answers), which logs the arrival of every request
with the run's input (``p<i>`` for the paced runs): "answer → next model request" ends when
the request reaches the model. ``BENCH_PAUSE_MODEL=scripted`` measures the in-process scripted
model instead (NOT the path users run: its own model-call log, ``TREADLE_MODEL_CALL_LOG``,
gives the time the worker called it).

    python -m bench.pause     (BENCH_PAUSE_RUNS=5000, BENCH_PAUSE_PACED=200,
                               BENCH_PAUSE_MODEL=http|scripted, BENCH_PAUSE_ANSWER=http|call)
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import sqlalchemy as sa

from bench.common import (
    LOG_DIR,
    PY,
    Floor,
    FloorResult,
    Outside,
    Probe,
    Procs,
    Section,
    api_key,
    close_runtime,
    count_status,
    emit,
    floor_env,
    free_port,
    log,
    med,
    merge,
    ms,
    new_prefix,
    p95,
    proc_cpu,
    proc_rss_mb,
    queued_messages,
    redis_cleanup,
    retrying,
    round_outcomes,
    scratch_db,
    start_api,
    start_treadle_workers,
    table_bytes,
    treadle_env,
    treadle_runtime,
    verdict,
    wait_for,
)
from bench.services import ANSWER, ASK

N = int(os.environ.get("BENCH_PAUSE_RUNS", "5000"))
PACED = min(int(os.environ.get("BENCH_PAUSE_PACED", "200")), N)
WORKERS = int(os.environ.get("BENCH_PAUSE_WORKERS", "2"))
CONC = int(os.environ.get("BENCH_PAUSE_CONCURRENCY", "16"))
MODEL = os.environ.get("BENCH_PAUSE_MODEL", "http")  # http: the path users run
ANSWER_BY = os.environ.get("BENCH_PAUSE_ANSWER", "http")  # http: the path users run
TENANT = "bench"  # an API key's tenant (``default`` is the keyless operator's)
BARE_KEY = "bench-bare-key"  # the bare answer path's one API key (``bare_answers``)
TABLES = ["runs", "messages", "tool_calls", "events", "usage", "outbox"]
TARGET_HOPS = 3.0


def ask_agent(i: int, model_url: str | None) -> dict[str, Any]:
    """Reply 1 asks, reply 2 answers: the fake model process at ``model_url`` (the path users
    run), or the in-process scripted model (None), whose profiles are named ``p<i>`` for the
    paced runs (its model-call log then tells their calls apart)."""
    if model_url is not None:
        model = {"provider": "openai", "base_url": model_url, "model": "fake"}
        return {"kind": "agent", "ask": True, "model": model}
    replies = [
        {"tool_calls": [{"id": "ask_1", "name": "ask_user", "arguments": ASK}]},
        {"text": ANSWER},
    ]
    name = f"p{i}" if i < PACED else "pause"
    return {
        "kind": "agent",
        "ask": True,
        "model": {"provider": "scripted", "name": name, "replies": replies},
    }


class Answers:
    """How the bench answers a run's ask: over HTTP to the API with a key (one keep-alive
    client per thread), or by calling ``answer_run`` in this process (``api`` None)."""

    def __init__(self, rt: Any, api: str | None, headers: dict[str, str]) -> None:
        self.rt, self.api, self.headers = rt, api, headers
        self._local = threading.local()
        self._clients: list[httpx.Client] = []

    def __call__(self, run_id: str) -> None:
        if self.api is None:
            from shared.engine.commands import answer_run

            retrying(answer_run, self.rt, TENANT, run_id, "ask_1", ["red"])
            return
        body = {"ask_id": "ask_1", "answers": ["red"]}
        r = self._client().post(f"{self.api}/v1/runs/{run_id}/answer", json=body)
        if r.status_code != 200:
            raise RuntimeError(f"answer {run_id}: {r.status_code} {r.text[:200]}")

    def _client(self) -> httpx.Client:
        client: httpx.Client | None = getattr(self._local, "client", None)
        if client is None:
            client = httpx.Client(headers=self.headers, timeout=30)
            self._local.client = client
            self._clients.append(client)
        return client

    def close(self) -> None:
        for c in self._clients:
            c.close()


def model_calls(path: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    try:
        with open(path) as fh:
            for line in fh:
                parts = line.split()
                if len(parts) == 3:
                    out.setdefault(parts[0], []).append(float(parts[2]))
    except OSError:
        pass
    return out


def main() -> None:
    from bench.common import submit

    started = time.time()
    procs = Procs()
    call_log = str(LOG_DIR / f"pause-calls-{os.getpid()}.log")
    res: dict[str, Any] = {}
    with scratch_db("pause") as url:
        prefix, fprefix = new_prefix("pause"), new_prefix("pfloor")
        rt = treadle_runtime(url, prefix, pool_size=6)
        poll = sa.create_engine(url, pool_size=1)  # not rt.engine: its statements are counted
        floors: list[FloorResult] = []
        answer: Answers | None = None
        try:
            floor = Floor(procs, url, fprefix, concurrency=4)
            env = treadle_env(
                url, prefix, TREADLE_MODEL_CALL_LOG=call_log, TREADLE_DB_POOL_SIZE="8"
            )
            ports = [free_port() for _ in range(WORKERS)]
            names = start_treadle_workers(procs, env, WORKERS, CONC, tag="pw", metrics_ports=ports)
            # the reaper's clock, as in production (re-drives what a PostgreSQL restart by
            # another suite's chaos test could strand)
            procs.start(
                "beat",
                [
                    PY,
                    "-m",
                    "celery",
                    "-A",
                    "worker.app",
                    "beat",
                    "--loglevel=WARNING",
                    "-s",
                    str(LOG_DIR / "beat-schedule"),
                ],
                env,
            )
            pids = [procs.pid(n) for n in names]
            with rt.engine.connect() as conn:
                bytes0 = table_bytes(conn, TABLES)
            ids: list[str] = [""] * N
            model_url = None
            if MODEL == "http":
                model_url = Outside(procs, script="ask", call_log=call_log).model_url

            if ANSWER_BY == "http":
                answer = Answers(rt, start_api(procs, env), api_key(rt, TENANT))
            else:
                answer = Answers(rt, None, {})

            def sub(i: int) -> None:
                ids[i] = submit(rt, ask_agent(i, model_url), text=f"p{i}", tenant=TENANT)

            log(f"pause: submitting {N} runs (4 threads, submit_run)")
            probe = Probe().attach(rt.engine)
            t0 = time.time()
            first = min(1000, N)
            cache = _cache_size()
            m0 = probe.mark()
            for i in range(min(50, N)):  # the first ones one by one: statements per submit
                sub(i)
            res["submit_sql"] = probe.summary(m0, probe.mark())
            res["submit_n"] = min(50, N)
            # RSS with 1,000, 2,000, … runs waiting, each time idle after the same kind of
            # work (submitting and pausing 1,000 runs): only the number waiting differs
            curve: list[tuple[int, float]] = []
            done = min(50, N)
            while done < N or not curve:
                upto = min(N, (len(curve) + 1) * first)
                with ThreadPoolExecutor(4) as pool:
                    list(pool.map(sub, range(done, upto)))
                done = upto
                wait_for(
                    lambda upto=upto: count_status(poll, ["waiting"]) >= upto,
                    600,
                    f"{upto} waiting runs",
                    interval=0.2,
                )
                time.sleep(2)
                curve.append((upto, sum(proc_rss_mb(p) for p in pids)))
            res["curve"] = curve
            res["cache"] = cache
            res["submit_s"] = time.time() - t0
            res["all_waiting_s"] = time.time() - t0
            time.sleep(2)
            res["queued"] = queued_messages(prefix)
            with rt.engine.connect() as conn:
                bytes1 = table_bytes(conn, TABLES)
                res["outbox"] = int(
                    conn.execute(sa.text("SELECT count(*) FROM outbox")).scalar_one()
                )
                res["rows"] = {
                    t: int(conn.execute(sa.text(f"SELECT count(*) FROM {t}")).scalar_one())
                    for t in TABLES
                }
                res["logical"] = int(
                    conn.execute(
                        sa.text(
                            "SELECT (SELECT sum(pg_column_size(r.*)) FROM runs r)"
                            " + (SELECT sum(pg_column_size(m.*)) FROM messages m)"
                            " + (SELECT sum(pg_column_size(t.*)) FROM tool_calls t)"
                            " + (SELECT sum(pg_column_size(e.*)) FROM events e)"
                            " + (SELECT sum(pg_column_size(u.*)) FROM usage u)"
                        )
                    ).scalar_one()
                )
            res["rss_1k"], res["rss_n"] = [curve[0][1]], [curve[-1][1]]
            cpu0 = sum(proc_cpu(p) for p in pids)
            time.sleep(5)
            res["idle_cpu"] = (sum(proc_cpu(p) for p in pids) - cpu0) / 5
            res["bytes"] = {t: bytes1[t] - bytes0[t] for t in TABLES}

            log(f"pause: {PACED} paced answers (one at a time), floor blocks around them")
            floors.append(floor.run(chains=1, hops=100))
            paced: dict[int, tuple[float, float]] = {}
            m0 = probe.mark()
            for i in range(PACED):
                a = time.time()
                answer(ids[i])
                paced[i] = (a, time.time())
                rid = ids[i]
                wait_for(
                    lambda rid=rid: _status(poll, rid) == "completed",
                    30,
                    f"run {rid}",
                    interval=0.005,
                )
            res["answer_sql"] = probe.summary(m0, probe.mark())
            res["answer_call"] = [b - a for a, b in paced.values()]
            floors.append(floor.run(chains=1, hops=100))
            if model_url is not None and ANSWER_BY == "http":
                log(f"pause: {PACED} paced answers to the bare answer path (NOT treadle)")
                res["lat_bare"] = bare_answers(procs, floor, fprefix, model_url, call_log)
                floors.append(floor.run(chains=1, hops=100))
            floor.close()

            log(f"pause: answering the other {N - PACED} at once (4 threads)")
            bulk: dict[int, tuple[float, float]] = {}

            def ans(i: int) -> None:
                a = time.time()
                answer(ids[i])
                bulk[i] = (a, time.time())

            t1 = time.time()
            with ThreadPoolExecutor(4) as pool:
                list(pool.map(ans, range(PACED, N)))
            res["answer_s"] = time.time() - t1
            wait_for(
                lambda: count_status(poll, ["completed"]) >= N,
                400,
                f"{N} completed runs",
                interval=0.5,
            )
            res["drain_s"] = time.time() - t1
            res["rss_end"] = [proc_rss_mb(p) for p in pids]
            res["outcomes"] = round_outcomes(ports)
            res["failed"] = count_status(poll, ["failed"])
            res["lat_bulk"] = _claim_latencies(rt, ids, bulk)
        finally:
            if answer is not None:
                answer.close()
            procs.stop_all()
            close_runtime(rt)
            poll.dispose()
            redis_cleanup(prefix)
            redis_cleanup(fprefix)
    calls = model_calls(call_log)
    res["lat_paced"] = _latencies(paced, calls)
    fl = merge(floors)
    report(res, fl, started)


def bare_answers(
    procs: Procs, floor: Floor, prefix: str, model_url: str, call_log: str
) -> list[float]:
    """``PACED`` answers, one at a time, over HTTP to the answer path, bare (``bench.bareapi``
    and ``bench.floorapp.bare_round``: NOT treadle), on the floor's worker and the same fake
    model: answer sent → the round's model request at the model, seconds each."""
    from bench.bareapi import KEYS_DDL, key_hash

    with floor.engine.begin() as conn:
        conn.execute(sa.text(KEYS_DDL))
        conn.execute(
            sa.text("INSERT INTO floor_keys VALUES (:h, 'bench') ON CONFLICT DO NOTHING"),
            {"h": key_hash(BARE_KEY)},
        )
    port = free_port()
    cmd = [PY, "-m", "uvicorn", "--factory", "bench.bareapi:create_app", "--host", "127.0.0.1"]
    env = {**floor_env(floor.url, prefix), "BENCH_BARE_MODEL_URL": model_url}
    procs.start("bareapi", [*cmd, "--port", str(port), "--log-level", "warning"], env)
    base = f"http://127.0.0.1:{port}"
    out: list[float] = []
    with httpx.Client(headers={"Authorization": f"Bearer {BARE_KEY}"}, timeout=30) as client:
        wait_for(lambda: _bare_up(client, base), 30, "the bare answer API")
        for i, chain in enumerate(floor.new_chains(PACED + 3)):
            a = time.time()
            r = client.post(f"{base}/answer/{chain}", json={"ask_id": "ask_1", "answers": ["red"]})
            if r.status_code != 200:
                raise RuntimeError(f"bare answer {chain}: {r.status_code}")
            arrived = wait_for(
                lambda c=chain: model_calls(call_log).get(f"b{c}"), 30, f"chain {chain}", 0.002
            )
            if i >= 3:  # the first three warm the path
                out.append(min(arrived) - a)
    procs.stop("bareapi")
    return out


def _bare_up(client: httpx.Client, base: str) -> bool:
    try:
        return client.post(f"{base}/answer/-1").status_code in (200, 401, 409)
    except httpx.HTTPError:
        return False


def _status(engine: sa.Engine, run_id: str) -> str:
    with engine.connect() as conn:
        return str(
            conn.execute(
                sa.text("SELECT status FROM runs WHERE id = :r"), {"r": run_id}
            ).scalar_one()
        )


def _cache_size() -> int:
    try:
        from shared.engine import cache

        return int(cache._specs._size)  # noqa: SLF001 - a bench reads the bound
    except Exception:
        return 0


def _claim_latencies(
    rt: Any, ids: list[str], answers: dict[int, tuple[float, float]]
) -> tuple[list[float], list[float]]:
    """(answer sent → round 2 claimed, answer committed → round 2 claimed), from the
    ``round.started`` events (taken just before the claim, one transaction before the model
    request)."""
    with rt.engine.connect() as conn:
        started = dict(
            conn.execute(
                sa.text(
                    "SELECT run_id, created_at FROM events WHERE type = 'round.started' AND "
                    "CAST(data AS jsonb) ->> 'round' = '2'"
                )
            ).all()
        )
    start, commit = [], []
    for i, (a, b) in answers.items():
        t = started.get(ids[i])
        if t is not None:
            start.append(t - a)
            commit.append(t - b)
    return start, commit


def _latencies(
    answers: dict[int, tuple[float, float]], calls: dict[str, list[float]]
) -> tuple[list[float], list[float]]:
    """(answer sent → 2nd model request, answer committed+published → 2nd model request)."""
    start, commit = [], []
    for i, (a, b) in answers.items():
        times = sorted(calls.get(f"p{i}", []))
        if len(times) >= 2:
            start.append(times[1] - a)
            commit.append(times[1] - b)
    return start, commit


def report(res: dict[str, Any], fl: FloorResult, started: float) -> None:
    hop = med(fl.hop_latencies)
    q = res["queued"]
    queued = sum(q.values())
    s = Section(
        f"{N:,} runs waiting on an ask ({WORKERS} worker processes x {CONC} threads)",
        ["measure", "value", "target", "verdict"],
    )
    s.row(
        "queued broker messages while all wait (ready + unacked)",
        f"{queued} ({', '.join(f'{k} {v}' for k, v in q.items())})",
        "0",
        verdict(queued == 0),
    )
    s.row("outbox rows while all wait", res["outbox"], "0", verdict(res["outbox"] == 0))
    r1, rn = sum(res["rss_1k"]), sum(res["rss_n"])
    grow = rn - r1
    s.row(
        f"worker RSS at 1,000 waiting → at {N:,} waiting, idle (MB, all workers)",
        f"{r1:.1f} → {rn:.1f} ({grow:+.1f})",
        "no growth",
        verdict(grow <= max(5.0, 0.05 * r1)),
    )
    if len(res["curve"]) >= 2:
        (na, ra), (nb, rb) = res["curve"][-2], res["curve"][-1]
        s.row(f"… the last step, {na:,} → {nb:,} waiting", f"{rb - ra:+.1f} MB", "", "")
    s.row(
        "worker RSS by runs waiting (MB, all workers, idle)",
        " → ".join(f"{n:,}: {r:.0f}" for n, r in res["curve"]),
        "",
        "",
    )
    s.row(
        "worker RSS after all were answered and completed (MB)",
        f"{sum(res['rss_end']):.1f}",
        "",
        "",
    )
    s.row("worker CPU while all wait (idle)", f"{res['idle_cpu'] * 1000:.1f} ms/s", "", "")
    total = sum(res["bytes"].values())
    s.row("database bytes per waiting run (tables + indexes + TOAST)", f"{total / N:,.0f}", "", "")
    s.row("… of which row data (pg_column_size of the rows)", f"{res['logical'] / N:,.0f}", "", "")
    idle = 2 * len(res["curve"])
    s.row(
        "time until all were waiting (submitted 4 at a time, 2 s idle per 1,000)",
        f"{res['all_waiting_s']:.1f} s ({N / (res['all_waiting_s'] - idle):.0f} runs/s)",
        "",
        "",
    )
    s.note(
        "Per table, bytes per waiting run: "
        + ", ".join(
            f"{t} {b / N:,.0f} ({res['rows'][t] / N:.1f} rows)" for t, b in res["bytes"].items()
        )
        + ". RSS growth allowance: 5 MB or 5%."
    )
    if res.get("cache"):
        s.note(
            f"The engine keeps per-process LRU caches of {res['cache']:,} run specs and "
            f"{res['cache']:,} run histories (`shared/engine/cache.py`), waiting runs "
            "included: RSS grows with the runs a worker has seen until they are full (here "
            f"{WORKERS} processes x {res['cache']:,} runs), then stays flat."
        )
    s.note(
        "A `celery beat` process ran the reaper every TREADLE_REAPER_INTERVAL (5 s), as "
        "in production."
    )
    sp, cp = res["lat_paced"]
    sb, cb = res["lat_bulk"]
    a = Section(
        "Answer → next model request"
        + (
            " (answered over HTTP)"
            if ANSWER_BY == "http"
            else " (answered in-process: NOT the path users run)"
        ),
        [
            "answers",
            "from the answer call: median ms",
            "p95 ms",
            "in floor hops",
            "target",
            "verdict",
            "from its commit: median ms",
            "p95 ms",
        ],
    )
    ratio = med(sp) / hop
    a.row(
        f"{len(sp)} paced (one at a time)",
        ms(med(sp), 2),
        ms(p95(sp), 2),
        f"**{ratio:.2f}**",
        f"<= {TARGET_HOPS:.0f}",
        verdict(ratio <= TARGET_HOPS),
        ms(med(cp), 2),
        ms(p95(cp), 2),
    )
    a.row(
        f"{len(sb):,} at once (4 answering threads; → round 2 claimed)",
        ms(med(sb), 0),
        ms(p95(sb), 0),
        f"{med(sb) / hop:.0f}",
        "",
        "",
        ms(med(cb), 0),
        ms(p95(cb), 0),
    )
    if res.get("lat_bare"):
        xs = res["lat_bare"]
        a.row(
            f"{len(xs)} paced to the answer path, bare (NOT treadle: `bench/bareapi.py`, "
            "key SELECT + one transaction + the round task sent; the round claims, then "
            "calls the same model)",
            ms(med(xs), 2),
            ms(p95(xs), 2),
            f"{med(xs) / hop:.2f}",
            "",
            "",
            "",
            "",
        )
    a.row(
        "floor hop (1 chain, around the paced answers)",
        ms(hop, 2),
        ms(p95(fl.hop_latencies), 2),
        "1.00",
        "",
        "",
        "",
        "",
    )
    a.note(
        f"All {N - PACED:,} at once: answered in {res['answer_s']:.1f} s "
        f"({(N - PACED) / res['answer_s']:.0f} answers/s), all completed "
        f"{res['drain_s']:.1f} s after the first ({(N - PACED) / res['drain_s']:.0f} "
        f"rounds/s); failed runs: {res['failed']}. The latency under load is queueing "
        "behind the other answers."
    )
    if res.get("outcomes"):
        a.note(
            "Round tasks the workers ran, by outcome (their `treadle_rounds_total`): "
            + ", ".join(f"{k} {v:,.0f}" for k, v in sorted(res["outcomes"].items()))
            + f" for {2 * N:,} rounds of work; `stale` = a duplicate message for a version "
            "the run had left (the reaper re-sends an outbox row nobody consumed within "
            "TREADLE_REDRIVE_SECONDS, 15 s: under a backlog that long, every queued "
            "message is sent again)."
        )
    how = (
        "the client sent `POST /v1/runs/{id}/answer` with an API key to the API process (the "
        "path users run: the request, the key check, the answer's transaction, the publish, "
        "the response)"
        if ANSWER_BY == "http"
        else "`answer_run` called in the bench's process (the API handler's work without HTTP "
        "or the key check: NOT the path users run)"
    )
    a.note(
        f"From the answer = {how} → "
        + (
            "the next request reached the fake model in its own process over HTTP (the "
            "path users run)"
            if MODEL == "http"
            else "the scripted model called in the worker (NOT the path users run)"
        )
        + "; from its commit = the answer's response received → the same."
    )
    sa_, ss = res["answer_sql"], res["submit_sql"]
    call = res["answer_call"]
    if ANSWER_BY == "http":
        per = f"Per answer over HTTP (client side, {PACED} paced): {ms(med(call), 2)} ms median. "
    else:
        per = (
            f"Per `answer_run` (driver side, {PACED} paced): {ms(med(call), 2)} ms median, "
            f"{sa_['statements'] / PACED:.1f} statements, {sa_['commits'] / PACED:.1f} commits, "
            f"{sa_['checkouts'] / PACED:.1f} pool checkouts, SQL "
            f"{sa_['sql_s'] / PACED * 1000:.2f} ms on average; the rest is Python and the "
            "Celery publish and the wake-up PUBLISH. "
        )
    a.note(
        per + f"Per `submit_run` ({res['submit_n']} sequential): "
        f"{ss['statements'] / res['submit_n']:.1f} statements, "
        f"{ss['commits'] / res['submit_n']:.1f} commits, "
        f"{ss['checkouts'] / res['submit_n']:.1f} pool checkouts."
    )
    head = [
        [f"queued broker messages while {N:,} runs wait", str(queued), "0", verdict(queued == 0)],
        [
            "worker RSS, 1,000 → all waiting",
            f"{r1:.0f} → {rn:.0f} MB ({grow:+.1f})",
            "no growth",
            verdict(grow <= max(5.0, 0.05 * r1)),
        ],
        ["database bytes per waiting run", f"{total / N:,.0f}", "", ""],
        [
            "answer → next model request, in floor hops (paced, median; answered "
            + ("over HTTP)" if ANSWER_BY == "http" else "in-process: NOT the path users run)"),
            f"{ratio:.2f} ({ms(med(sp), 1)} ms)",
            f"<= {TARGET_HOPS:.0f}",
            verdict(ratio <= TARGET_HOPS),
        ],
    ]
    emit("pause", "Pauses: waiting runs hold nothing", [s, a], started, head)


if __name__ == "__main__":
    main()
