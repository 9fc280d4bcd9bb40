"""``run_python`` (SPEC T-1): model code in a bubblewrap sandbox.

Isolation: ``bwrap --unshare-all --die-with-parent`` (new user, PID, network, IPC, UTS and
cgroup namespaces: no network at all), ``/usr`` and the ``/lib*`` and ``/bin`` links
read-only, a few ``/etc`` files, the sandbox's own ``/proc`` (its PID namespace only, never
the host's) and ``/dev``, the root remounted read-only, and a size-limited tmpfs ``/work``
(the working directory) holding copies of the run's attachments; nothing of the worker's
files or working directory is bound in. bubblewrap itself starts with an empty environment
from ``/``: inside the PID namespace PID 1 is a bubblewrap process whose ``/proc/1/environ``
the code can read, so the worker's environment (database URL, provider keys) must never reach
it; the code gets only the fixed ``_ENV``. A seccomp filter (``shared.tools.seccomp``) narrows
the kernel calls it can make. A worker running as root starts the sandbox under a throw-away
uid, so the kernel's process limit applies (root is exempt from it).

Limits: each sandbox runs in its own cgroup (memory, processes, CPU) under its worker's
group, whose memory limit bounds every sandbox of the worker together, and at most
``TREADLE_SANDBOX_SLOTS`` run at once per worker, queued fairly by tenant
(``shared.tools.confinement``); it joins its group before bubblewrap starts, so every process
it forks is counted. Inside, the driver (``sandbox_driver.py``) runs the code with rlimits on
CPU time, address space, processes, file size and open files, and kills it at the wall limit;
the host caps stdout and stderr (head and tail kept; far too much output kills the sandbox)
and kills the whole group if the sandbox outlives its wall limit. Files the code created in
``/work`` come back listed, small text files inlined.

Without bubblewrap (or where it cannot create namespaces), or without cgroups while
``TREADLE_SANDBOX_CGROUPS=required`` (the default), the tool is unavailable: the catalog
leaves it out with a warning, and it is never run unsandboxed or limited per process only.
From the run's point of view it is read-only: nothing outside the sandbox changes.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from pydantic import BaseModel, Field

from shared.errors import ToolError
from shared.llm.abort import Abort
from shared.tools import cgroups, seccomp
from shared.tools.base import FunctionTool, ToolContext, ToolResult
from shared.tools.cgroups import Cgroup
from shared.tools.confinement import Confinement
from shared.tools.registry import REGISTRY

__all__ = [
    "RUN_PYTHON",
    "Limits",
    "RunPythonArgs",
    "SandboxResult",
    "SandboxTool",
    "format_result",
    "run_python",
    "run_sandboxed",
    "unavailable_reason",
]

log = logging.getLogger("treadle.sandbox")

MB = 1024 * 1024
_DRIVER = Path(__file__).with_name("sandbox_driver.py")
_ETC = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/alternatives",
    "/etc/mime.types",
)
_ROOT_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/work",
    "TMPDIR": "/work",
    "LANG": "C.UTF-8",
    "PYTHONPATH": "/work",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "1",
    "MPLBACKEND": "Agg",
}
_UID_BASE, _UID_SPAN = 61_000, 1_000
_uids = itertools.count(os.getpid() * 37 % _UID_SPAN)
_HOST_GRACE_S = 5.0
_REPORT_MAX_BYTES = 1 * MB


@dataclass(frozen=True)
class Limits:
    wall_s: float = 30.0
    cpu_s: int = 30
    memory_mb: int = 512
    nproc: int = 64
    file_mb: int = 32  # largest file the code may write
    work_mb: int = 64  # the /work tmpfs, on top of the attachments copied in
    nofile: int = 256
    output_chars: int = 16_000  # kept per stream (head and tail)
    output_kill_bytes: int = 4 * MB  # more than this on a stream kills the sandbox
    file_text_chars: int = 4_000  # inlined per created text file
    files_text_chars: int = 12_000  # inlined in all
    max_files: int = 50


@dataclass(frozen=True)
class SandboxResult:
    exit_code: int | None  # negative: killed by that signal; None: no report
    timed_out: bool
    stdout: str
    stderr: str
    seconds: float
    files: list[dict[str, Any]] = field(default_factory=list)
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    killed: str | None = None  # why the host killed the sandbox

    def as_data(self) -> dict[str, Any]:
        return asdict(self)


# --- availability ---------------------------------------------------------------------------


def _interpreter(configured: str) -> tuple[str, tuple[str, ...]] | None:
    """The sandbox's Python and any prefix it needs bound (one outside ``/usr``)."""
    candidates = (
        [configured]
        if configured
        else [
            "/usr/local/bin/python3",
            "/usr/bin/python3",
            os.path.join(sys.base_prefix, "bin", "python3"),
        ]
    )
    for exe in candidates:
        if not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
            continue
        real = os.path.realpath(exe)
        if real.startswith("/usr/"):
            return real, ()
        return real, (str(Path(real).parents[1]),)
    return None


def _settings() -> Any:
    from shared.config import get_settings

    return get_settings()


@functools.cache
def unavailable_reason() -> str | None:
    """Why run_python cannot run in this process (None: it can). Probed once."""
    if not sys.platform.startswith("linux"):
        return "the sandbox needs Linux"
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed"
    try:
        seccomp.program()
    except seccomp.UnsupportedArch as exc:
        return str(exc)
    settings = _settings()
    if _interpreter(settings.sandbox_python) is None:
        return "no Python interpreter for the sandbox (set TREADLE_SANDBOX_PYTHON)"
    if settings.sandbox_cgroups == "required" and isinstance(found := cgroups.detect(), str):
        return f"cgroups are unavailable ({found}); TREADLE_SANDBOX_CGROUPS=off to run without"
    try:
        probe = run_sandboxed("print('ok')", [], Limits(wall_s=10, cpu_s=10))
    except (OSError, ToolError) as exc:
        return f"bubblewrap cannot start a sandbox here: {exc}"
    if probe.exit_code != 0 or probe.stdout.strip() != "ok":
        return f"bubblewrap cannot start a sandbox here: {probe.stderr.strip()[:300]}"
    return None


def warn_if_unavailable() -> None:
    """The startup warning (cheap: no probe) when bubblewrap is missing."""
    if sys.platform.startswith("linux") and shutil.which("bwrap") is None:
        log.warning(
            "run_python is disabled: bubblewrap (bwrap) is not installed "
            "(apt-get install bubblewrap); agents that list it run without it"
        )


# --- the sandbox ------------------------------------------------------------------------------


class _Capture:
    """One output stream: the first and last bytes kept, the total counted."""

    def __init__(self, cap_chars: int) -> None:
        self.head_cap = cap_chars * 3 // 5
        self.tail_cap = cap_chars - self.head_cap
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            del self.tail[: max(0, len(self.tail) - self.tail_cap)]

    @property
    def truncated(self) -> bool:
        return self.total > self.head_cap + self.tail_cap

    def text(self) -> str:
        if not self.truncated:
            return bytes(self.head + self.tail).decode("utf-8", errors="replace")
        head = self.head.decode("utf-8", errors="replace")
        tail = self.tail.decode("utf-8", errors="replace")
        omitted = self.total - len(self.head) - len(self.tail)
        return f"{head}\n[... {omitted} bytes of output omitted ...]\n{tail}"


def _pump(stream: IO[bytes], sink: _Capture, limit: int, on_flood: Callable[[], None]) -> None:
    flooded = False
    while chunk := stream.read1(65_536):  # type: ignore[attr-defined]
        sink.add(chunk)
        if sink.total > limit and not flooded:
            flooded = True
            on_flood()
    stream.close()


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name[:200] or "file")
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _unique_names(names: Sequence[str]) -> list[str]:
    out: list[str] = []
    for name in names:
        base, dot, ext = name.rpartition(".") if "." in name.lstrip(".") else (name, "", "")
        candidate, n = name, 2
        while candidate in out or candidate in ("", ".", ".."):
            candidate = f"{base} ({n}){dot}{ext}" if dot else f"{name} ({n})"
            n += 1
        out.append(candidate)
    return out


def _system_binds(extra: Sequence[str]) -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for path in _ROOT_LINKS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in _ETC:
        args += ["--ro-bind-try", path, path]
    for path in extra:
        if not path.startswith("/usr/"):
            args += ["--ro-bind", path, path]
    return args


def _bwrap_args(
    python: str,
    extra: Sequence[str],
    files: Sequence[tuple[str, int]],
    code_fd: int,
    driver_fd: int,
    seccomp_fd: int,
    work_bytes: int,
) -> list[str]:
    args = [
        shutil.which("bwrap") or "bwrap",
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--hostname",
        "sandbox",
        "--clearenv",
    ]
    for key, value in _ENV.items():
        args += ["--setenv", key, value]
    args += _system_binds(extra)
    args += ["--proc", "/proc", "--dev", "/dev", "--size", str(work_bytes), "--tmpfs", "/work"]
    for name, fd in files:
        args += ["--file", str(fd), f"/work/{name}"]
    args += [
        "--ro-bind-data",
        str(code_fd),
        "/sandbox/main.py",
        "--ro-bind-data",
        str(driver_fd),
        "/sandbox/driver.py",
        "--seccomp",
        str(seccomp_fd),
        "--remount-ro",
        "/",
        "--remount-ro",
        "/dev",
        "--chdir",
        "/work",
        python,
        "-I",
        "/sandbox/driver.py",
    ]
    return args


def _identity() -> dict[str, Any]:
    """As root, a throw-away uid: the kernel exempts root from RLIMIT_NPROC."""
    if os.geteuid() != 0:
        return {}
    uid = _UID_BASE + next(_uids) % _UID_SPAN
    return {"user": uid, "group": uid, "extra_groups": []}


def _command(args: list[str], group: Cgroup | None) -> tuple[list[str], dict[str, Any]]:
    """How to start bubblewrap: in ``group`` (joined first, as root; then the throw-away uid
    by ``setpriv``), or, without a group, as ``_identity`` says."""
    if group is None:
        return args, _identity()
    who = _identity()
    setpriv = shutil.which("setpriv", path="/usr/bin:/bin")
    if who and setpriv:
        uid = who["user"]
        args = [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *args]
    return cgroups.joining(group, args), {}


def _driver_config(limits: Limits, report_fd: int) -> dict[str, Any]:
    return {
        "report_fd": report_fd,
        "wall_s": limits.wall_s,
        "cpu_s": limits.cpu_s,
        "memory_bytes": limits.memory_mb * MB,
        "nproc": limits.nproc,
        "file_bytes": limits.file_mb * MB,
        "nofile": limits.nofile,
        "file_text_chars": limits.file_text_chars,
        "files_text_chars": limits.files_text_chars,
        "max_files": limits.max_files,
    }


def run_sandboxed(
    code: str,
    files: Sequence[tuple[str, bytes]],
    limits: Limits,
    python: str | None = None,
    abort: Abort | None = None,
    group: Cgroup | None = None,
) -> SandboxResult:
    """Run ``code`` with ``files`` copied into its work dir; wait for it within the limits.
    ``abort`` firing kills the sandbox and raises its ``Aborted`` error. ``group``: the
    cgroup it runs in (None: per-process limits only)."""
    found = _interpreter(python if python is not None else _settings().sandbox_python)
    if found is None:
        raise ToolError("no Python interpreter for the sandbox")
    fds: list[int] = []
    try:
        names = _unique_names([n for n, _ in files])
        file_fds = [
            (name, _memfd(name, data)) for name, (_, data) in zip(names, files, strict=True)
        ]
        fds += [fd for _, fd in file_fds]
        code_fd = _memfd("main.py", code.encode("utf-8"))
        driver_fd = _memfd("driver.py", _DRIVER.read_bytes())
        filter_fd = _memfd("seccomp", seccomp.program())
        fds += [code_fd, driver_fd, filter_fd]
        report_r, report_w = os.pipe()  # owned by _supervise: closed once, never by us
        work = limits.work_mb * MB + sum(len(d) for _, d in files)
        args = _bwrap_args(found[0], found[1], file_fds, code_fd, driver_fd, filter_fd, work)
        args.append(json.dumps(_driver_config(limits, report_w)))
        return _supervise(args, tuple(fds), report_r, report_w, limits, abort or Abort(), group)
    finally:
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass


def _supervise(
    args: list[str],
    pass_fds: tuple[int, ...],
    report_r: int,
    report_w: int,
    limits: Limits,
    abort: Abort,
    group: Cgroup | None = None,
) -> SandboxResult:
    started = time.monotonic()
    proc = _spawn(args, pass_fds, report_r, report_w, group)
    killed: list[str] = []
    kill = functools.partial(_kill, proc, group, killed)
    out, err = _Capture(limits.output_chars), _Capture(limits.output_chars)
    flood = functools.partial(kill, f"output over {limits.output_kill_bytes // MB} MB")
    report: list[bytes] = []
    threads = [
        threading.Thread(target=_pump, args=(proc.stdout, out, limits.output_kill_bytes, flood)),
        threading.Thread(target=_pump, args=(proc.stderr, err, limits.output_kill_bytes, flood)),
        threading.Thread(target=_read_all, args=(report_r, report)),
    ]
    for t in threads:
        t.daemon = True
        t.start()
    with abort.closing(functools.partial(kill, "stopped from outside")):
        try:
            proc.wait(timeout=limits.wall_s + _HOST_GRACE_S)
        except subprocess.TimeoutExpired:
            kill(f"still running {_HOST_GRACE_S:g}s after the wall limit")
            proc.wait()
    for t in threads:
        t.join(timeout=5)
    abort.check()
    if group is not None and group.oom_kills() and not killed:
        killed.append("out of memory (the sandbox's memory limit)")
    return _result(
        b"".join(report), proc.returncode, out, err, killed, time.monotonic() - started, limits
    )


def _spawn(
    args: list[str],
    pass_fds: tuple[int, ...],
    report_r: int,
    report_w: int,
    group: Cgroup | None,
) -> subprocess.Popen[bytes]:
    """The sandbox process, in a session of its own. ``report_w`` is closed here, whatever
    happens; ``report_r`` too when the process could not start."""
    command, who = _command(args, group)
    try:
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(*pass_fds, report_w),
            start_new_session=True,
            env={},  # PID 1 inside is bwrap: its environ is readable there (see the module doc)
            cwd="/",
            **who,
        )
    except BaseException:
        os.close(report_r)
        raise
    finally:
        # the sandbox holds the only writer now: EOF when it is gone. Closed here once: a
        # second close could hit the same number reused by another sandbox's pipe
        os.close(report_w)


def _kill(
    proc: subprocess.Popen[bytes], group: Cgroup | None, killed: list[str], reason: str
) -> None:
    """SIGKILL to the sandbox's process group (and its cgroup); the first reason is kept."""
    if not killed:
        killed.append(reason)
    with contextlib.suppress(ProcessLookupError):  # already gone: nothing to kill
        os.killpg(proc.pid, signal.SIGKILL)
    if group is not None:
        group.kill()


def _read_all(fd: int, into: list[bytes]) -> None:
    """The driver's report (untrusted, like everything from the sandbox): at most 1 MB. The
    reader owns ``fd`` and closes it at EOF (as ``_pump`` its stream): closed by anyone else
    while it reads, the number could be reused under it."""
    size = 0
    try:
        while chunk := os.read(fd, 65_536):
            size += len(chunk)
            if size <= _REPORT_MAX_BYTES:
                into.append(chunk)
    finally:
        os.close(fd)


def _clean_files(items: Any, limits: Limits) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for item in items if isinstance(items, list) else []:
        if not (
            isinstance(item, dict)
            and isinstance(item.get("path"), str)
            and isinstance(item.get("size"), int)
        ):
            continue
        clean = {"path": item["path"][:500], "size": item["size"], "new": bool(item.get("new"))}
        if isinstance(item.get("text"), str):
            clean["text"] = item["text"][: limits.file_text_chars]
            clean["text_truncated"] = bool(item.get("text_truncated"))
        out.append(clean)
    return out[: limits.max_files]


def _parse_report(raw: bytes) -> dict[str, Any]:
    try:
        report = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return report if isinstance(report, dict) else {}


def _result(
    raw: bytes,
    bwrap_code: int,
    out: _Capture,
    err: _Capture,
    killed: list[str],
    seconds: float,
    limits: Limits,
) -> SandboxResult:
    report = _parse_report(raw)
    code = report.get("exit_code")
    reported = report.get("seconds")
    stderr = err.text()
    if not report and not killed and bwrap_code != 0 and not stderr.strip():
        stderr = f"the sandbox failed to start (bwrap exit status {bwrap_code})"
    return SandboxResult(
        exit_code=code if isinstance(code, int) else None,
        timed_out=report.get("timed_out") is True,
        stdout=out.text(),
        stderr=stderr,
        seconds=round(reported if isinstance(reported, float | int) else seconds, 3),
        files=_clean_files(report.get("files"), limits),
        stdout_truncated=out.truncated,
        stderr_truncated=err.truncated,
        killed=killed[0] if killed else None,
    )


# --- the tool ---------------------------------------------------------------------------------


def _status(res: SandboxResult, limits: Limits) -> str:
    if res.killed:
        return f"killed: {res.killed}"
    if res.timed_out:
        return f"killed: wall time limit of {limits.wall_s:g}s reached"
    code = res.exit_code
    if code is None:
        return "the sandbox ended without a report"
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
        why = {
            "SIGXCPU": " (CPU time limit)",
            "SIGKILL": " (a limit was hit)",
            "SIGXFSZ": " (file size limit)",
        }.get(name, "")
        return f"killed by {name}{why}"
    return f"exit code {code}"


def _format_file(item: dict[str, Any]) -> list[str]:
    lines = [f"--- file {item['path']} ({item['size']} bytes) ---"]
    if "text" in item:
        lines.append(item["text"] + ("\n[... truncated ...]" if item.get("text_truncated") else ""))
    else:
        lines.append("(binary, or over the inline budget: not shown)")
    return lines


def format_result(res: SandboxResult, limits: Limits) -> str:
    """What the model reads: status, stdout, stderr, created files."""
    lines = [f"[{_status(res, limits)}; {res.seconds:.2f}s]"]
    if res.stdout:
        lines += ["--- stdout ---", res.stdout.rstrip("\n")]
    if res.stderr:
        lines += ["--- stderr ---", res.stderr.rstrip("\n")]
    if not res.stdout and not res.stderr:
        lines.append("(no output)")
    if res.files:
        lines.append("--- files created or changed in the work dir ---")
        lines += [f"{f['path']} ({f['size']} bytes)" for f in res.files]
        for item in res.files:
            lines += _format_file(item)
    return "\n".join(lines)


class RunPythonArgs(BaseModel):
    code: str = Field(max_length=100_000, description="Python 3 source. Print what you need.")
    timeout_s: float | None = Field(
        default=None, gt=0, description="Wall-time limit in seconds (capped by the server)."
    )


def _attachments(ctx: ToolContext) -> list[tuple[str, bytes]]:
    if not ctx.attachments:
        return []
    if ctx.files is None:
        raise ToolError("this run's files cannot be read here")
    try:
        return [
            (str(r.get("name") or r["id"]), ctx.files.read(str(r["id"]))) for r in ctx.attachments
        ]
    except FileNotFoundError as exc:
        raise ToolError(str(exc)) from None


def _limits(args: RunPythonArgs, ctx: ToolContext, host: Confinement) -> Limits:
    settings = _settings()
    cap = float(settings.sandbox_timeout)
    wall = ctx.time_left(min(args.timeout_s or cap, cap))
    return Limits(
        wall_s=wall,
        cpu_s=max(1, math.ceil(wall)),
        memory_mb=host.memory_mb,
        nproc=host.max_processes,
    )


def run_python(args: RunPythonArgs, ctx: ToolContext) -> ToolResult:
    """Run Python 3 code in an isolated sandbox: no network (no package installs), the run's
    attached files in the working directory, time, memory and output limits. Returns the
    exit status, stdout, stderr and the files the code created (small text files inline)."""
    host = ctx.confinement or Confinement.from_settings(_settings())
    reason = unavailable_reason() or host.unavailable
    if reason:
        raise ToolError(f"run_python is unavailable: {reason}")
    files = _attachments(ctx)
    wait = ctx.time_left(float(_settings().sandbox_timeout))  # for a slot, at most
    with host.child(ctx.tenant, host.limits(), timeout=wait, abort=ctx.abort) as group:
        limits = _limits(args, ctx, host)  # the time left after the wait for a slot
        result = run_sandboxed(args.code, files, limits, abort=ctx.abort, group=group)
    return ToolResult(text=format_result(result, limits), data=result.as_data())


class SandboxTool(FunctionTool[RunPythonArgs]):
    """A ``FunctionTool`` that says when it cannot run (the catalog leaves it out then)."""

    @property
    def unavailable(self) -> str | None:
        return unavailable_reason()


RUN_PYTHON = REGISTRY.add(SandboxTool.from_function(run_python, name="run_python", read_only=True))
warn_if_unavailable()
