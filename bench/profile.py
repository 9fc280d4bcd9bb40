"""Where a tool round's CPU goes: tool runs driven by the engine's own functions in this process
(a list for a broker, the fake OpenAI-compatible server in a subprocess, PostgreSQL), profiled.

    python -m bench.profile          (PROFILE_RUNS=4, PROFILE_ROUNDS=30; writes
                                      bench/results/profile.md)

The table lists the top functions by own time and by cumulative time (cProfile, which adds
overhead to small functions: read it for proportions, not absolute milliseconds) and the CPU
per round measured without the profiler in the same run.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import subprocess
import sys
import time
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.common import (
    close_runtime,
    free_port,
    http_model_quick_tool_agent,
    new_prefix,
    scratch_db,
    submit,
    treadle_runtime,
    wait_for,
)

RUNS = int(os.environ.get("PROFILE_RUNS", "4"))
ROUNDS = int(os.environ.get("PROFILE_ROUNDS", "30"))
OUT = Path(__file__).parent / "results" / "profile.md"

SERVER = """
import sys, time
from bench.common import quick_tool_responder
from shared.llm.fake_server import FakeLLMServer
s = FakeLLMServer(quick_tool_responder, port=int(sys.argv[1])).start()
print("ready", flush=True)
while True:
    time.sleep(3600)
"""


def _drive(rt: Any, queue: deque[Any], base_url: str, runs: int, rounds: int) -> int:
    from shared.engine.testing import StubBroker

    broker = StubBroker()
    rt2 = replace(rt, publish=broker)
    for _ in range(runs):
        submit(rt2, http_model_quick_tool_agent(base_url, rounds))
    return broker.drain(rt2)


def main() -> None:
    from shared.engine.livebus import InProcessBus

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(port)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        wait_for(lambda: "ready" in server.stdout.readline(), 30, "fake server")
        base_url = f"http://127.0.0.1:{port}/v1"
        with scratch_db("profile") as url:
            rt = replace(treadle_runtime(url, new_prefix("profile")), live=InProcessBus())
            queue: deque[Any] = deque()
            _drive(rt, queue, base_url, 1, 5)  # warm caches, imports, pools
            c0, t0 = time.process_time(), time.perf_counter()
            n = _drive(rt, queue, base_url, RUNS, ROUNDS)
            cpu, wall = time.process_time() - c0, time.perf_counter() - t0
            prof = cProfile.Profile()
            prof.enable()
            _drive(rt, queue, base_url, RUNS, ROUNDS)
            prof.disable()
            close_runtime(rt)
    finally:
        server.kill()
    rounds = RUNS * ROUNDS
    OUT.parent.mkdir(exist_ok=True)
    text = _report(prof, rounds, n, cpu, wall)
    OUT.write_text(text)
    print(text)


def _table(prof: cProfile.Profile, key: str, rounds: int, limit: int = 20) -> str:
    st = pstats.Stats(prof, stream=io.StringIO())
    rows = sorted(
        st.stats.items(), key=lambda kv: kv[1][2 if key == "tottime" else 3], reverse=True
    )
    out = ["| function | calls/round | own ms/round | cumulative ms/round |", "|---|---|---|---|"]
    for (path, line, name), (_cc, nc, tt, ct, _callers) in rows[:limit]:
        where = path.split("site-packages/")[-1].split("/treadle/")[-1]
        where = where.replace(str(Path(__file__).resolve().parents[1]) + "/", "")
        out.append(
            f"| `{where}:{line} {name}` | {nc / rounds:.1f} | {tt * 1000 / rounds:.2f} "
            f"| {ct * 1000 / rounds:.2f} |"
        )
    return "\n".join(out)


def _report(prof: cProfile.Profile, rounds: int, messages: int, cpu: float, wall: float) -> str:
    return "\n".join(
        [
            "# Profile of a tool round (in-process engine, PostgreSQL, fake model server)",
            "",
            f"{RUNS} runs x {ROUNDS} tool rounds; {messages} broker messages. Without the "
            f"profiler: **{cpu * 1000 / rounds:.2f} ms CPU** and {wall * 1000 / rounds:.2f} ms "
            "wall per tool round (this process: engine + model client; the fake server runs "
            "in another process).",
            "",
            "## Top 20 by own time",
            "",
            _table(prof, "tottime", rounds),
            "",
            "## Top 20 by cumulative time",
            "",
            _table(prof, "cumtime", rounds),
            "",
            "Reproduce: `python -m bench.profile` (PROFILE_RUNS, PROFILE_ROUNDS).",
            "",
        ]
    )


if __name__ == "__main__":
    main()
