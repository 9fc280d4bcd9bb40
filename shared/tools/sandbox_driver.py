"""The in-sandbox half of ``run_python`` (runs INSIDE bubblewrap, under the sandbox's Python;
standard library only; never imported by treadle itself — its source is copied in).

It runs ``/sandbox/main.py`` as a child with rlimits (CPU, address space, processes, file
size, open files, no core dumps) in its own session, kills it at the wall limit, kills
whatever it left running, then reports the files created or changed in ``/work`` as one JSON
object on the file descriptor named in its configuration. The child's stdout and stderr go
straight to the host, which caps them.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from typing import Any

WORK = "/work"
MAIN = "/sandbox/main.py"
MAX_WALK = 2000


def _limit(cfg: dict[str, Any]) -> None:
    """In the child, before exec: hard limits it cannot raise again."""
    cpu = int(cfg["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU, then SIGKILL
    for res, value in (
        (resource.RLIMIT_AS, cfg["memory_bytes"]),
        (resource.RLIMIT_NPROC, cfg["nproc"]),
        (resource.RLIMIT_FSIZE, cfg["file_bytes"]),
        (resource.RLIMIT_NOFILE, cfg["nofile"]),
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(res, (int(value), int(value)))


def _snapshot(root: str) -> dict[str, tuple[int, int]]:
    """Regular files under ``root``: relative path → (size, mtime_ns). Symlinks not followed."""
    seen: dict[str, tuple[int, int]] = {}
    for base, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(base, d))]
        for name in names:
            path = os.path.join(base, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if os.path.isfile(path) and not os.path.islink(path):
                seen[os.path.relpath(path, root)] = (st.st_size, st.st_mtime_ns)
            if len(seen) >= MAX_WALK:
                return seen
    return seen


def _text(path: str, size: int, cap: int) -> str | None:
    """The file's text (first ``cap`` characters) when it is UTF-8, else None."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(cap * 4)
    except OSError:
        return None
    if b"\x00" in head:
        return None
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if size <= len(head) or exc.start < len(head) - 3:
            return None
        text = head[: exc.start].decode("utf-8")
    return text[:cap]


def _files(before: dict[str, tuple[int, int]], cfg: dict[str, Any]) -> list[dict[str, Any]]:
    after = _snapshot(WORK)
    changed = sorted(p for p, st in after.items() if before.get(p) != st)
    out: list[dict[str, Any]] = []
    budget = int(cfg["files_text_chars"])
    for rel in changed[: int(cfg["max_files"])]:
        size = after[rel][0]
        item: dict[str, Any] = {"path": rel, "size": size, "new": rel not in before}
        cap = min(int(cfg["file_text_chars"]), budget)
        text = _text(os.path.join(WORK, rel), size, cap) if cap > 0 else None
        if text is not None:
            item["text"] = text
            item["text_truncated"] = len(text) < size
            budget -= len(text)
        out.append(item)
    return out


def _kill_rest() -> None:
    """Everything else in the sandbox's PID namespace (forks left behind), before listing."""
    try:
        os.kill(-1, signal.SIGKILL)  # all we may signal except ourselves and PID 1
    except OSError:
        pass


def main() -> None:
    cfg = json.loads(sys.argv[1])
    report_fd = int(cfg["report_fd"])
    before = _snapshot(WORK)
    started = time.monotonic()
    child = subprocess.Popen(
        [sys.executable, MAIN],
        cwd=WORK,
        start_new_session=True,
        preexec_fn=lambda: _limit(cfg),
        stdin=subprocess.DEVNULL,
    )
    timed_out = False
    try:
        code = child.wait(timeout=float(cfg["wall_s"]))
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(child.pid, signal.SIGKILL)
        code = child.wait()
    _kill_rest()
    report = {
        "exit_code": code,
        "timed_out": timed_out,
        "seconds": round(time.monotonic() - started, 3),
        "files": _files(before, cfg),
    }
    with os.fdopen(report_fd, "wb") as fh:
        fh.write(json.dumps(report).encode("utf-8"))


if __name__ == "__main__":
    main()
