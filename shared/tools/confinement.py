"""What a worker process lets the child processes of tenants' calls have (``run_python``
sandboxes, PDF readers), as a whole: at most ``TREADLE_SANDBOX_SLOTS`` at once, queued fairly
by tenant (``shared.tools.slots``), each in its own cgroup under the worker's group, whose
memory limit is ``TREADLE_SANDBOX_GROUP_MEMORY_MB`` (``shared.tools.cgroups``).

One ``Confinement`` per process, held by the runtime (``Runtime.confinement``) and handed to
tools in their ``ToolContext``. With ``TREADLE_SANDBOX_CGROUPS=required`` (the default) a
sandbox never starts without its group: where cgroups are not available, ``run_python`` is
unavailable (it says why) rather than limited per process only; ``off`` keeps the per-process
limits alone (a single-tenant machine). A PDF reader goes into a group when there are groups,
and is limited per process (CPU seconds, address space) either way.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from shared.errors import ToolError
from shared.llm.abort import Abort
from shared.tools.cgroups import Cgroup, GroupLimits, Hierarchy, WorkerGroups, detect
from shared.tools.slots import FairSlots

__all__ = ["MB", "Confinement"]

log = logging.getLogger("treadle.sandbox")
MB = 1024 * 1024


@dataclass
class Confinement:
    """Slots and groups for tenants' child processes (see the module doc)."""

    slots: FairSlots
    required: bool = True
    groups: WorkerGroups | None = None
    reason: str = ""  # why there are no groups
    max_processes: int = 32
    cpus: float = 1.0
    memory_mb: int = 512  # of one sandbox
    _registered: bool = field(default=False, init=False)

    @classmethod
    def from_settings(cls, settings: Any, hierarchy: Hierarchy | str | None = None) -> Confinement:
        found = detect() if hierarchy is None else hierarchy
        limits = GroupLimits(memory_bytes=int(settings.sandbox_group_memory_mb) * MB)
        groups = None
        reason = ""
        if isinstance(found, Hierarchy):
            groups = WorkerGroups(found, str(settings.sandbox_cgroup), limits)
        else:
            reason = found
        return cls(
            slots=FairSlots(int(settings.sandbox_slots)),
            required=settings.sandbox_cgroups == "required",
            groups=groups,
            reason=reason,
            max_processes=int(settings.sandbox_max_processes),
            cpus=float(settings.sandbox_cpus),
            memory_mb=int(settings.sandbox_memory_mb),
        )

    @property
    def unavailable(self) -> str | None:
        """Why a sandbox may not start here (None: it may)."""
        if self.groups is None and self.required:
            return (
                f"cgroups are unavailable ({self.reason}); a sandbox needs its own "
                "(TREADLE_SANDBOX_CGROUPS=off runs it with per-process limits only)"
            )
        return None

    def limits(self, memory_mb: int | None = None) -> GroupLimits:
        """A child's group: its memory (default: a sandbox's), the process and CPU limits of
        every sandbox."""
        memory = self.memory_mb if memory_mb is None else memory_mb
        return GroupLimits(memory * MB, pids=self.max_processes, cpus=self.cpus)

    @contextlib.contextmanager
    def child(
        self,
        tenant: str,
        limits: GroupLimits,
        *,
        timeout: float | None = None,
        abort: Abort | None = None,
        needs_group: bool = True,
    ) -> Iterator[Cgroup | None]:
        """A slot (waited for in line) and a group for one child process (None: no groups,
        and ``needs_group`` is False or they are not required). ToolError: the child may not
        start (no slot in time, no group)."""
        if needs_group and self.unavailable:
            raise ToolError(f"the sandbox cannot start: {self.unavailable}")
        with self.slots.slot(tenant, timeout, abort):
            if self.groups is None:
                yield None
                return
            with self._group(limits, needs_group) as group:
                yield group

    @contextlib.contextmanager
    def _group(self, limits: GroupLimits, needs_group: bool) -> Iterator[Cgroup | None]:
        assert self.groups is not None
        with contextlib.ExitStack() as stack:
            group: Cgroup | None = None
            try:
                group = stack.enter_context(self.groups.child(limits))
            except OSError as exc:
                if needs_group and self.required:
                    raise ToolError(f"the sandbox cannot start: no cgroup for it ({exc})") from None
                log.warning("no cgroup for a child process (%s); per-process limits only", exc)
            if group is not None:
                self._remove_at_exit()
            yield group

    def _remove_at_exit(self) -> None:
        if not self._registered and self.groups is not None:
            self._registered = True
            atexit.register(self.groups.close)

    def peak_memory(self) -> int:
        """The most memory this worker's children have held together (bytes)."""
        if self.groups is None:
            return 0
        return self.groups.group().peak_memory()
