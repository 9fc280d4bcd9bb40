"""Where a worker's round and tool tasks spend their wall time, from py-spy's raw stacks.

``bench.spy`` samples the threads holding the GIL: where a process spends CPU. A tool round
on an idle fleet is bounded by its critical path instead — waits included (a socket, the
database, a thread's start). Sample the worker with idle threads kept, then sum each task's
stacks by frame::

    BENCH_ROUNDS=400 BENCH_ROUNDS_RUNS=1 python -m bench.rounds &   # one long run
    py-spy record --idle --threads --nonblocking -r 500 -d 12 -f raw -o wall.raw \
        -p <pid of the `celery -A worker.app worker` process>
    python -m bench.wall wall.raw [rows]

Each task's table gives the share of its samples under each frame (cumulative): a task's
samples are the stacks under ``round_task`` or ``tool_task``; the kept threads that run tool
calls (``shared.engine.standby``) are summed apart, under ``Job._run``.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

_LINE = re.compile(r":\d+\)$")
KINDS = {"round": "round_task (", "tool": "tool_task (", "tool call": "Job._run ("}


def frames_by_kind(raw: str) -> tuple[Counter[str], dict[str, Counter[str]]]:
    """Samples per kind, and per kind the samples under each frame (line numbers dropped)."""
    totals: Counter[str] = Counter()
    under: dict[str, Counter[str]] = {k: Counter() for k in KINDS}
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        frames = [_LINE.sub(")", f) for f in stack.split(";")[1:] if f]
        kind = next((k for k, p in KINDS.items() if any(f.startswith(p) for f in frames)), None)
        if kind is None:
            continue
        totals[kind] += int(count)
        for frame in set(frames):
            under[kind][frame] += int(count)
    return totals, under


def table(kind: str, total: int, under: Counter[str], rows: int) -> str:
    """The frames under the task's own, by share of its samples (the frames every sample
    shares, the thread's and Celery's around the task, left out)."""
    top = [(n, f) for f, n in under.most_common() if n < total * 0.99]
    lines = [f"### {kind}: {total} samples", "", "| share | frame |", "|---|---|"]
    lines += [f"| {100 * n / total:.1f} % | `{f}` |" for n, f in top[:rows]]
    return "\n".join(lines)


def main() -> None:
    raw = Path(sys.argv[1]).read_text()
    rows = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    totals, under = frames_by_kind(raw)
    for kind in KINDS:
        if totals[kind]:
            print(table(kind, totals[kind], under[kind], rows), end="\n\n")


if __name__ == "__main__":
    main()
