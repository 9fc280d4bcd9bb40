"""Control groups for the processes tenants' input starts (``run_python`` sandboxes, PDF
readers): each in its own group with a memory, process and CPU limit, all of them under one
group per worker process whose memory limit is the group limit — so the children of a worker,
however many, never hold more memory together than the operator allows.

cgroup v1 (a hierarchy per controller: ``memory``, ``pids``, ``cpu``) and v2 (one unified
hierarchy with those controllers) are both supported; which one is mounted is read from
``/proc/self/mounts``. The groups live under ``<root>/<parent>/worker-<host>-<pid>``
(``parent``: ``TREADLE_SANDBOX_CGROUP``; ``host``: the host name, so containers sharing a
hierarchy never take each other's pids for their own); a worker removes its own at exit and
the groups its host's dead workers left when it makes its own. Making groups needs write
access there: root, or (v2) a delegated subtree.

A child joins its group before it runs anything: it is started as ``/bin/sh`` that writes its
own pid into the group's ``cgroup.procs`` and then ``exec``s the real command (``joining``),
so every process it ever forks is counted.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import re
import signal
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "CONTROLLERS",
    "Cgroup",
    "GroupLimits",
    "Hierarchy",
    "WorkerGroups",
    "detect",
    "joining",
]

log = logging.getLogger("treadle.sandbox")

CONTROLLERS = ("memory", "pids", "cpu")
MB = 1024 * 1024
_CPU_PERIOD_US = 100_000
# the shell's own variables (PWD) are not passed on: the command gets the environment it was
# started with, and nothing else
_JOIN = (
    'unset PWD OLDPWD; while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; '
    'shift; exec "$@"'
)
_counter = itertools.count(1)


@dataclass(frozen=True, slots=True)
class Hierarchy:
    """Where the controllers are mounted: v1, one directory per controller; v2, one."""

    version: int
    roots: tuple[Path, ...]


@dataclass(frozen=True, slots=True)
class GroupLimits:
    memory_bytes: int
    pids: int = 0  # 0: no limit of its own
    cpus: float = 0.0  # 0: no quota


def detect(mounts: str = "/proc/self/mounts") -> Hierarchy | str:
    """The hierarchy to use, or why there is none (cgroups not mounted, a controller missing,
    not writable)."""
    try:
        lines = Path(mounts).read_text().splitlines()
    except OSError as exc:
        return f"cannot read {mounts}: {exc}"
    v1: dict[str, Path] = {}
    v2: Path | None = None
    for line in lines:
        parts = line.split()
        if len(parts) < 4:
            continue
        where, kind, options = Path(parts[1]), parts[2], parts[3].split(",")
        if kind == "cgroup":
            v1.update({c: where for c in CONTROLLERS if c in options})
        elif kind == "cgroup2" and v2 is None:
            v2 = where
    if all(c in v1 for c in CONTROLLERS):
        return _writable(Hierarchy(1, tuple(v1[c] for c in CONTROLLERS)))
    if v2 is not None:
        have = _read(v2 / "cgroup.controllers").split()
        missing = [c for c in CONTROLLERS if c not in have]
        if not missing:
            return _writable(Hierarchy(2, (v2,)))
        return f"cgroup v2 at {v2} lacks the {', '.join(missing)} controller(s)"
    return "no cgroup hierarchy with the memory, pids and cpu controllers is mounted"


def _writable(h: Hierarchy) -> Hierarchy | str:
    denied = [str(r) for r in h.roots if not os.access(r, os.W_OK)]
    if denied:
        return (
            f"cgroups at {', '.join(denied)} are not writable by this process (uid {os.geteuid()})"
        )
    return h


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _write(path: Path, value: str) -> None:
    with open(path, "w") as fh:  # noqa: PTH123 - one write(2) of the whole value
        fh.write(value)


@dataclass(frozen=True, slots=True)
class Cgroup:
    """One group: its directory in each hierarchy (v1) or in the unified one (v2)."""

    version: int
    dirs: tuple[Path, ...]

    def child(self, name: str) -> Cgroup:
        return Cgroup(self.version, tuple(d / name for d in self.dirs))

    def make(self, limits: GroupLimits, *, parent: bool = False) -> None:
        """Create the group (idempotent) and set its limits. ``parent``: groups will be made
        inside it (v1: hierarchical memory; v2: the controllers enabled for its children)."""
        for d in self.dirs:
            d.mkdir(exist_ok=True)
        if self.version == 1:
            self._limits_v1(limits, parent)
        else:
            self._limits_v2(limits, parent)

    def _limits_v1(self, limits: GroupLimits, parent: bool) -> None:
        memory, pids, cpu = self.dirs
        if parent and _read(memory / "memory.use_hierarchy") == "0":
            _write(memory / "memory.use_hierarchy", "1")
        _write(memory / "memory.limit_in_bytes", str(limits.memory_bytes))
        if (memory / "memory.memsw.limit_in_bytes").exists():  # no swapping around the limit
            with contextlib.suppress(OSError):
                _write(memory / "memory.memsw.limit_in_bytes", str(limits.memory_bytes))
        if limits.pids:
            _write(pids / "pids.max", str(limits.pids))
        if limits.cpus:
            _write(cpu / "cpu.cfs_period_us", str(_CPU_PERIOD_US))
            _write(cpu / "cpu.cfs_quota_us", str(int(limits.cpus * _CPU_PERIOD_US)))

    def _limits_v2(self, limits: GroupLimits, parent: bool) -> None:
        (d,) = self.dirs
        _write(d / "memory.max", str(limits.memory_bytes))
        with contextlib.suppress(OSError):
            _write(d / "memory.swap.max", "0")
        if limits.pids:
            _write(d / "pids.max", str(limits.pids))
        if limits.cpus:
            _write(d / "cpu.max", f"{int(limits.cpus * _CPU_PERIOD_US)} {_CPU_PERIOD_US}")
        if parent:
            _write(d / "cgroup.subtree_control", " ".join(f"+{c}" for c in CONTROLLERS))

    @property
    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    def pids(self) -> set[int]:
        return {int(p) for d in self.dirs for p in _read(d / "cgroup.procs").split() if p}

    def kill(self) -> None:
        """SIGKILL every process in the group (until none is left, a few tries)."""
        for _ in range(20):
            left = self.pids()
            if not left:
                return
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)

    def remove(self) -> None:
        """Kill what is left and remove the group (its directories)."""
        self.kill()
        for d in self.dirs:
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # processes still exiting
                    time.sleep(0.02)

    def peak_memory(self) -> int:
        """The most memory the group has held (bytes; 0 when the kernel does not say)."""
        name = "memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"
        value = _read(self.dirs[0] / name)
        return int(value) if value.isdigit() else 0

    def oom_kills(self) -> int:
        """Processes the kernel killed for the group's memory limit."""
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        for line in _read(self.dirs[0] / name).splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
        return 0


def joining(group: Cgroup, command: Sequence[str]) -> list[str]:
    """``command``, started so that it joins ``group`` before it runs (see the module doc)."""
    return ["/bin/sh", "-c", _JOIN, "sh", *group.procs_files, "--", *command]


@dataclass
class WorkerGroups:
    """This worker process's group (``<root>/<parent>/worker-<host>-<pid>``, the group limit) and
    the groups made in it, one per child."""

    hierarchy: Hierarchy
    parent: str
    limits: GroupLimits
    _group: Cgroup | None = field(default=None, init=False)
    _group_pid: int = field(default=0, init=False)  # a forked child makes its own
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def group(self) -> Cgroup:
        """The worker's group, made on first use (OSError: it cannot be made)."""
        with self._lock:
            if self._group is None or self._group_pid != os.getpid():
                base = Cgroup(self.hierarchy.version, self.hierarchy.roots).child(self.parent)
                _make_base(base)
                _remove_dead(base)
                group = base.child(f"{_prefix()}{os.getpid()}")
                group.make(self.limits, parent=True)
                self._group, self._group_pid = group, os.getpid()
            return self._group

    @contextlib.contextmanager
    def child(self, limits: GroupLimits) -> Iterator[Cgroup]:
        """A group for one child process, removed (its processes killed) after the block."""
        group = self.group().child(f"c{next(_counter)}")
        group.make(limits)
        try:
            yield group
        finally:
            group.remove()

    def close(self) -> None:
        """Remove the worker's group (at exit: its children are gone)."""
        with self._lock:
            if self._group is not None and self._group_pid == os.getpid():
                self._group.remove()
                self._group = None


def _make_base(base: Cgroup) -> None:
    """The parent of every worker's group: made once, no limit of its own."""
    for d in base.dirs:
        d.mkdir(exist_ok=True)
    if base.version == 1:
        memory = base.dirs[0]
        if _read(memory / "memory.use_hierarchy") == "0":
            with contextlib.suppress(OSError):
                _write(memory / "memory.use_hierarchy", "1")
    else:
        (d,) = base.dirs
        enabled = _read(d / "cgroup.subtree_control").split()
        if not all(c in enabled for c in CONTROLLERS):
            _write(d / "cgroup.subtree_control", " ".join(f"+{c}" for c in CONTROLLERS))


def _remove_dead(base: Cgroup) -> None:
    """The groups of worker processes that are gone (a killed worker leaves its group)."""
    for name in sorted({p.name for d in base.dirs if d.is_dir() for p in d.iterdir()}):
        pid = name.removeprefix(_prefix())
        if not (name.startswith(_prefix()) and pid.isdigit()) or _alive(int(pid)):
            continue
        stale = base.child(name)
        for sub in {p.name for d in stale.dirs if d.is_dir() for p in d.iterdir() if p.is_dir()}:
            stale.child(sub).remove()
        stale.remove()


def _prefix() -> str:
    """``worker-<host>-``: the names of this host's workers' groups."""
    host = re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname())[:64] or "host"
    return f"worker-{host}-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
