"""Where a real worker's CPU goes: the throughput bench's shape on the path users run (tool
runs on the fake model in its own process, streamed SSE over HTTP with a 200 ms reply, one
inline HTTP tool per round, one ``treadle worker -P threads -c 64``, defaults), sampled by
py-spy while it works.

    python -m bench.spy          (SPY_RUNS=500, SPY_SECONDS=20; needs py-spy: pip install
                                  py-spy; writes bench/results/worker-profile.md)

py-spy samples the threads holding the GIL (``--gil``): in a threads-pool worker that is where
the CPU goes (a thread waiting on PostgreSQL, Redis or the model holds no GIL). The tables sum
the raw stacks by leaf (own) and by frame (cumulative); rounds/s and worker CPU per round are
measured over the same window.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

from bench.common import (
    Outside,
    Procs,
    api_key,
    close_runtime,
    new_prefix,
    path_name,
    proc_cpu,
    redis_cleanup,
    scratch_db,
    start_api,
    start_treadle_workers,
    submit,
    treadle_env,
    treadle_runtime,
    wait_for,
)

RUNS = int(os.environ.get("SPY_RUNS", "500"))
SECONDS = int(os.environ.get("SPY_SECONDS", "20"))
CONC = 64
OUT = Path(__file__).parent / "results" / "worker-profile.md"
API_OUT = Path(__file__).parent / "results" / "api-profile.md"
_FRAME = re.compile(r"\s*\(([^)]*?)(:\d+)?\)$")


def _rounds(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        q = sa.text("SELECT count(*) FROM usage WHERE purpose = 'round'")
        return int(conn.execute(q).scalar_one())


def _frames(stack: str) -> list[str]:
    return [_FRAME.sub(lambda m: f" ({m.group(1)})", f) for f in stack.split(";")]


def tables(raw: str, own_rows: int = 20, cum_rows: int = 40) -> tuple[int, str, str]:
    """py-spy's raw output (``stack count`` lines) summed by leaf and by frame."""
    own: collections.Counter[str] = collections.Counter()
    cum: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n, frames = int(count), _frames(stack)
        total += n
        own[frames[-1]] += n
        for f in set(frames):
            cum[f] += n

    def table(counter: collections.Counter[str], rows: int) -> str:
        lines = ["| share | function |", "|---|---|"]
        for name, n in counter.most_common(rows):
            lines.append(f"| {100 * n / max(1, total):.1f} % | `{name}` |")
        return "\n".join(lines)

    return total, table(own, own_rows), table(cum, cum_rows)


def _record(spy: str, pid: int, path: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [spy, "record", "-p", str(pid), "-d", str(SECONDS), "-r", "250", "--gil"]
        + ["--nonblocking", "-f", "raw", "-o", str(path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _clients(
    api: str, headers: dict[str, str], agent: dict[str, Any], stop: threading.Event, ids: list[str]
) -> None:
    """What users do meanwhile: submit runs over HTTP with an API key and poll their status."""
    with httpx.Client(headers=headers, timeout=30) as client:
        while not stop.is_set():
            r = client.post(f"{api}/v1/runs", json={"agent": agent, "input": "go"})
            if r.status_code < 300:
                ids.append(r.json()["id"])
            for run_id in ids[-5:]:
                client.get(f"{api}/v1/runs/{run_id}")
            stop.wait(0.05)


def main() -> None:
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if spy is None:
        raise SystemExit("bench.spy needs py-spy (pip install py-spy)")
    procs = Procs()
    with scratch_db("spy") as url, tempfile.TemporaryDirectory() as tmp:
        prefix = new_prefix("spy")
        rt = treadle_runtime(url, prefix, pool_size=4)
        admin = sa.create_engine(url, pool_size=2)
        stop = threading.Event()
        try:
            outside = Outside(procs, latency=0.2, text_chars=200)
            agent = outside.agent(8)
            with ThreadPoolExecutor(4) as pool:
                list(pool.map(lambda _: submit(rt, agent), range(RUNS)))
            env = treadle_env(url, prefix)  # defaults but `-c`
            api = start_api(procs, env)  # defaults: auth required
            headers = api_key(rt, "bench")
            pid = procs.pid(start_treadle_workers(procs, env, 1, CONC, tag="spy-")[0])
            wait_for(lambda: _rounds(admin) > 0, 120, "the first round")
            ids: list[str] = []
            clients = [
                threading.Thread(
                    target=_clients, args=(api, headers, agent, stop, ids), daemon=True
                )
                for _ in range(2)
            ]
            for c in clients:
                c.start()
            time.sleep(4)
            n0, c0, t0 = _rounds(admin), proc_cpu(pid), time.time()
            a0 = proc_cpu(procs.pid("api"))
            paths = {"worker": Path(tmp) / "worker.raw", "api": Path(tmp) / "api.raw"}
            recs = [
                _record(spy, pid, paths["worker"]),
                _record(spy, procs.pid("api"), paths["api"]),
            ]
            for rec in recs:
                rec.wait(SECONDS + 60)
            n1, c1, t1 = _rounds(admin), proc_cpu(pid), time.time()
            a1 = proc_cpu(procs.pid("api"))
            stop.set()
            raws = {k: v.read_text() for k, v in paths.items()}
            if keep := os.environ.get("SPY_RAW_DIR"):  # the raw stacks, for a closer look
                for k, v in raws.items():
                    (Path(keep) / f"{k}.raw").write_text(v)
        finally:
            stop.set()
            procs.stop_all()
            close_runtime(rt)
            admin.dispose()
            redis_cleanup(prefix)
    rounds = max(1, n1 - n0)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    shape = (
        f"{RUNS} tool runs queued, then more submitted over HTTP by two clients (with an API "
        f"key: auth required, the default) that also poll "
        f"(~{len(ids)} in all), on {path_name()} (HTTP model in its own process, 200 ms "
        f"per reply, one inline read-only HTTP tool per round, defaults) on one "
        f"`treadle worker -P threads -c {CONC}` and one API process (uvicorn), PostgreSQL + "
        f"Redis; `py-spy record --gil -r 250` on both for {SECONDS} s."
    )
    for what, out, cpu in (
        ("worker", OUT, f"{1000 * (c1 - c0) / rounds:.2f} ms of worker CPU per round"),
        ("api", API_OUT, f"{a1 - a0:.1f} s of API CPU over the window"),
    ):
        total, own, cum = tables(raws[what])
        text = "\n".join(
            [
                f"# Profile of a real {what} process (py-spy, threads holding the GIL)",
                "",
                f"`python -m bench.spy`, {when}: {shape} {total} samples. Over the window: "
                f"**{rounds / (t1 - t0):.1f} rounds/s, {cpu}** (the profiler's own cost "
                "included).",
                "",
                "## Top 20 by own time",
                "",
                own,
                "",
                "## Top 40 by cumulative time",
                "",
                cum,
                "",
            ]
        )
        out.write_text(text)
        print(text)


if __name__ == "__main__":
    main()
