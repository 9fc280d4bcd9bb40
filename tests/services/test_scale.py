"""Scale: 3 worker processes, 300 runs of 5 rounds against the fake server with 200 ms model
latency: all complete, work spread over every worker. ``SCALE_RUNS`` sets the number of runs
(300; 120 under CI=true, a loaded machine)."""

from __future__ import annotations

import re
import time
from typing import Any

import sqlalchemy as sa

import tests.plugins  # noqa: F401  (the echo tool, also loaded by the workers)
from scheduler.embedded import ReaperLoop
from shared.agent.spec import AgentSpec
from shared.engine import commands
from shared.engine.runtime import Runtime
from shared.llm.fake_server import FakeLLMServer, ReplySpec
from shared.store.tables import runs
from tests.support import ROUND_DONE, WorkerProcs, knob, wait_for

RUNS, ROUNDS, LATENCY = int(knob("SCALE_RUNS", 300, 120)), 5, 0.2


def _responder(body: dict[str, Any]) -> ReplySpec:
    n = sum(1 for m in body["messages"] if m["role"] == "assistant")
    if n < ROUNDS - 1:
        return ReplySpec(
            first_byte_latency=LATENCY,
            tool_calls=[{"id": f"c{n}", "name": "echo", "arguments": {"text": f"step {n}"}}],
        )
    return ReplySpec(first_byte_latency=LATENCY, text="done")


def _completed(rt: Runtime) -> int:
    with rt.engine.connect() as conn:
        return int(
            conn.execute(
                sa.select(sa.func.count()).select_from(runs).where(runs.c.status == "completed")
            ).scalar_one()
        )


def test_three_workers_share_the_runs(prod_rt: Runtime, workers: WorkerProcs) -> None:
    names = workers.start_many(["alpha", "beta", "gamma"], concurrency=16)
    reaper = ReaperLoop(prod_rt, prod_rt.settings.reaper_interval).start()  # as beat would
    with FakeLLMServer(_responder) as llm:
        spec = AgentSpec.model_validate(
            {
                "kind": "agent",
                "tools": ["echo"],
                "model": {"provider": "openai", "base_url": llm.base_url, "model": "m"},
            }
        )
        started = time.monotonic()
        for i in range(RUNS):
            commands.submit_run(prod_rt, commands.RunInput(agent=spec, input=f"job {i}"))
        try:
            wait_for(lambda: _completed(prod_rt) == RUNS, 240, interval=0.2, what=f"{RUNS} runs")
        except AssertionError:
            with prod_rt.engine.connect() as conn:
                stuck = conn.execute(
                    sa.select(
                        runs.c.status, runs.c.open_calls, runs.c.round, sa.func.count()
                    ).group_by(runs.c.status, runs.c.open_calls, runs.c.round)
                ).all()
            raise AssertionError(f"not all runs completed: {stuck}") from None
        elapsed = time.monotonic() - started
        peak = llm.max_concurrency
    reaper.stop()
    per_worker = {n: len(re.findall(ROUND_DONE, workers.log(n))) for n in names}
    rounds = RUNS * ROUNDS
    print(
        f"\nscale: runs={RUNS} rounds={rounds} seconds={elapsed:.1f} "
        f"rounds/s={rounds / elapsed:.1f} peak_model_concurrency={peak} "
        f"per_worker_rounds={per_worker}"
    )
    assert sum(per_worker.values()) >= rounds
    assert all(n > rounds / 10 for n in per_worker.values()), per_worker
