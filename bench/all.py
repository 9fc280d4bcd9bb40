"""Run every benchmark (each in its own process, one after the other) and write
``bench/results/latest.md``: a summary, every table, the date, the machine and the command.

    python -m bench.all                 (what `make bench` runs)
    python -m bench.all rounds stream   (some of them)
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import subprocess
import sys
import time

from bench.common import PG_ADMIN, PY, REDIS_URL, RESULTS, ROOT, machine

SCRIPTS = ["floor", "rounds", "throughput", "inflight", "pause", "stream"]


def _out(cmd: list[str]) -> str:
    try:
        return subprocess.run(
            cmd, capture_output=True, text=True, cwd=ROOT, timeout=20
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


def _services() -> tuple[str, str]:
    import redis
    import sqlalchemy as sa

    pg = rv = "?"
    with contextlib.suppress(Exception):
        eng = sa.create_engine(PG_ADMIN)
        with eng.connect() as conn:
            pg = str(conn.execute(sa.text("SHOW server_version")).scalar_one())
            pg += ", max_connections " + str(
                conn.execute(sa.text("SHOW max_connections")).scalar_one()
            )
        eng.dispose()
    with contextlib.suppress(Exception):
        rv = str(redis.Redis.from_url(REDIS_URL, socket_timeout=5).info("server")["redis_version"])
    return pg, rv


def _pg_started() -> str:
    import sqlalchemy as sa

    try:
        eng = sa.create_engine(PG_ADMIN)
        with eng.connect() as conn:
            return str(conn.execute(sa.text("SELECT pg_postmaster_start_time()")).scalar_one())
    except Exception:
        return "?"
    finally:
        with contextlib.suppress(Exception):
            eng.dispose()


def main(argv: list[str]) -> int:
    names = argv or SCRIPTS
    started = time.time()
    load0 = os.getloadavg()
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    walls: dict[str, float] = {}
    failed: list[str] = []
    restarted: list[str] = []
    for name in names:
        t = time.time()
        pg0 = _pg_started()
        print(f"==> python -m bench.{name}", file=sys.stderr, flush=True)
        for suffix in (".md.tmp", ".json.tmp"):
            (RESULTS / f"{name}{suffix}").unlink(missing_ok=True)
        rc = subprocess.run([PY, "-m", f"bench.{name}"], cwd=ROOT).returncode
        walls[name] = time.time() - t
        if rc != 0:
            failed.append(name)
        if _pg_started() != pg0:
            restarted.append(name)
    total = time.time() - started
    load1 = os.getloadavg()
    m = machine()
    pg, rv = _services()
    import celery
    import sqlalchemy

    commit = _out(["git", "rev-parse", "--short", "HEAD"])
    dirty = _out(["git", "status", "--porcelain", "--untracked-files=no"])
    command = "make bench" if not argv else f"python -m bench.all {' '.join(argv)}"
    lines = [
        "# treadle benchmarks — latest run",
        "",
        f"- **date**: {when}",
        f"- **machine**: {m['cores']} cores ({m['cpu']}), {m['memory']} RAM, Linux "
        f"{m['kernel']}; PostgreSQL {pg}; Redis {rv}; Python {m['python']}, Celery "
        f"{celery.__version__}, SQLAlchemy {sqlalchemy.__version__}",
        f"- **load average** (1 min) at start / end: {load0[0]:.1f} / {load1[0]:.1f} — other "
        "engineers' test suites share these 2 cores, PostgreSQL and Redis; only ratios "
        "measured side by side in the same run are meaningful",
        f"- **engine**: commit {commit}"
        + (" plus uncommitted changes in the working tree" if dirty else ""),
        f"- **command**: `{command}` — wall time {total / 60:.1f} min ("
        + ", ".join(f"{n} {w:.0f} s" for n, w in walls.items())
        + ")",
    ]
    if failed:
        lines.append(f"- **failed**: {', '.join(failed)} (see their output above the tables)")
    if restarted:
        lines.append(
            f"- **PostgreSQL was restarted** (by another suite's chaos test) during: "
            f"{', '.join(restarted)} — their figures include the outage"
        )
    lines += [
        "",
        "## Summary",
        "",
        "| bench | measure | value | target | verdict |",
        "|---|---|---|---|---|",
    ]
    for name in names:
        with contextlib.suppress(OSError, ValueError):
            for row in json.loads((RESULTS / f"{name}.json.tmp").read_text()):
                lines.append(f"| {name} | " + " | ".join(row) + " |")
    lines.append("")
    for name in names:
        try:
            lines.append((RESULTS / f"{name}.md.tmp").read_text())
        except OSError:
            lines.append(f"## {name}\n\n_no result (the script failed)_\n")
    (RESULTS / "latest.md").write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines[:12]), flush=True)
    print(f"\nwrote {RESULTS / 'latest.md'} in {total / 60:.1f} min", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
