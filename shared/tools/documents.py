"""Document text for ``read_files`` and the knowledge base, within limits a document cannot
break: a PDF is parsed in a child process (``pdf_child.py``) that limits its own CPU seconds
and memory, stops at a page and a character limit, and is killed at a wall limit or when the
caller's ``Abort`` fires. A 12 KB PDF whose 30 pages share one 2 MB content stream costs a
few seconds of one child's CPU, never minutes of a worker's or the API's.

Given the process's ``Confinement`` (``shared.tools.confinement``), a PDF child takes one of
the worker's sandbox slots (queued fairly by tenant: at most ``TREADLE_SANDBOX_SLOTS`` children
at once) and runs in its own cgroup under the worker's group, so however many documents arrive
at once their readers hold at most the group's memory together.

Text and markdown are decoded in process (cheap: bounded by the byte limit, the upload
limit). ``Extracted.truncated`` says a PDF limit cut the text short: ``read_files`` tells the
model, a dataset refuses the document.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shared.errors import ToolError
from shared.llm.abort import Abort
from shared.tools.cgroups import Cgroup, GroupLimits, joining

if TYPE_CHECKING:
    from shared.tools.confinement import Confinement

__all__ = ["IMAGE_TYPES", "DocumentLimits", "Extracted", "extract"]

MB = 1024 * 1024
IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
_CHILD = Path(__file__).with_name("pdf_child.py")
_WALL_GRACE_S = 5.0
_REPORT_MAX_BYTES = 64 * MB
_SLOT_WAIT_S = 60.0  # a reader waits this long for a slot at most (less with a deadline)
_CHILD_PROCESSES = 8  # a reader is one process; a few threads of it count too


@dataclass(frozen=True, slots=True)
class DocumentLimits:
    """What parsing one document may cost (``TREADLE_EXTRACT_*`` settings)."""

    cpu_s: float = 5.0
    memory_mb: int = 1024
    max_pages: int = 1000  # of a PDF
    max_chars: int = 1_000_000  # extracted from a PDF
    max_bytes: int = 20 * MB

    @classmethod
    def from_settings(cls, settings: Any) -> DocumentLimits:
        return cls(
            cpu_s=float(settings.extract_cpu_seconds),
            memory_mb=int(settings.extract_memory_mb),
            max_pages=int(settings.extract_max_pages),
            max_chars=int(settings.extract_max_chars),
            max_bytes=int(settings.files_max_bytes),
        )

    @property
    def wall_s(self) -> float:
        """Wall limit of the child: its CPU limit, twice over on a loaded machine, + start-up."""
        return self.cpu_s * 2 + _WALL_GRACE_S


@dataclass(frozen=True, slots=True)
class Extracted:
    text: str
    truncated: bool = False  # a page or character limit cut it short: the text is the start


def extract(
    data: bytes,
    content_type: str,
    name: str,
    limits: DocumentLimits | None = None,
    abort: Abort | None = None,
    confinement: Confinement | None = None,
    tenant: str = "default",
) -> Extracted:
    """A document's text: PDF pages (``--- page N ---`` markers), text as UTF-8. ToolError
    for an image, a binary or unreadable file, or one over the byte limit. ``confinement``:
    the process's slots and cgroups, where the PDF child waits its turn (as ``tenant``)."""
    lim = limits or DocumentLimits()
    if len(data) > lim.max_bytes:
        raise ToolError(f"{name} is over the {lim.max_bytes}-byte limit for documents")
    if content_type == "application/pdf":
        handle = abort or Abort()
        if confinement is None:
            return _pdf(data, name, lim, handle, None)
        group_limits = GroupLimits(lim.memory_mb * MB, pids=_CHILD_PROCESSES)
        with confinement.child(
            tenant,
            group_limits,
            timeout=handle.limit(_SLOT_WAIT_S),
            abort=handle,
            needs_group=False,
        ) as group:
            return _pdf(data, name, lim, handle, group)
    if content_type.startswith("text/"):
        return Extracted(data.decode("utf-8", errors="replace").removeprefix("\ufeff"))
    if content_type in IMAGE_TYPES:
        raise ToolError(
            f"{name} is an image ({content_type}): it is shown with the user's "
            "message to a model that can see images; read_files reads documents"
        )
    raise ToolError(f"{name} is binary ({content_type or 'unknown type'}) and has no text to read")


def _config(lim: DocumentLimits) -> str:
    return json.dumps(
        {
            "cpu_s": lim.cpu_s,
            "memory_bytes": lim.memory_mb * MB,
            "max_pages": lim.max_pages,
            "max_chars": lim.max_chars,
            "max_bytes": lim.max_bytes,
        }
    )


def _pdf(
    data: bytes, name: str, lim: DocumentLimits, abort: Abort, group: Cgroup | None
) -> Extracted:
    report = _run_child(data, name, lim, abort, group)
    if "error" in report:
        raise ToolError(f"cannot read PDF {name}: {report['error']}")
    pages = [str(p) for p in report.get("pages") or []]
    if not any(pages):
        raise ToolError(f"{name} has no extractable text (a scanned PDF?)")
    text = "\n\n".join(f"--- page {i} ---\n{t}" for i, t in enumerate(pages, 1))
    return Extracted(text, truncated=bool(report.get("truncated")))


def _run_child(
    data: bytes, name: str, lim: DocumentLimits, abort: Abort, group: Cgroup | None
) -> dict[str, Any]:
    """Run the extractor (in ``group``, joined before it starts); kill it at the wall limit or
    when ``abort`` fires."""
    started = time.monotonic()
    command = [sys.executable, "-I", str(_CHILD), _config(lim)]
    proc = subprocess.Popen(
        joining(group, command) if group is not None else command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={},  # nothing of the worker's environment
        cwd="/",
        start_new_session=True,
    )
    with abort.closing(lambda: _kill(proc)):
        try:
            out, _ = proc.communicate(data, timeout=abort.limit(lim.wall_s))
        except subprocess.TimeoutExpired:
            _kill(proc)
            proc.communicate()
            abort.check()
            raise ToolError(f"reading PDF {name} took over {lim.wall_s:g}s; gave up") from None
    abort.check()
    if proc.returncode != 0:
        if group is not None and group.oom_kills():
            raise ToolError(f"reading PDF {name} needs over {lim.memory_mb} MB; gave up")
        raise ToolError(_died(name, proc.returncode, lim, time.monotonic() - started))
    return _parse(out[:_REPORT_MAX_BYTES])


def _kill(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _died(name: str, code: int, lim: DocumentLimits, seconds: float) -> str:
    if code in (-signal.SIGXCPU, -signal.SIGKILL):
        return f"reading PDF {name} needs over {lim.cpu_s:g}s of CPU; gave up"
    return f"cannot read PDF {name}: the reader stopped (status {code}, {seconds:.1f}s)"


def _parse(raw: bytes) -> dict[str, Any]:
    try:
        report = json.loads(raw)
    except ValueError:
        return {"error": "the reader gave no result"}
    return report if isinstance(report, dict) else {"error": "the reader gave no result"}
