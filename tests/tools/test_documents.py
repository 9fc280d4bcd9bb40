"""Document parsing within limits (``shared.tools.documents``): a PDF is read in a child
process with CPU, memory, page and character limits, killed when its caller's ``Abort``
fires; ``read_files`` says when a limit cut a file short. The PDF bomb: a 12 KB PDF whose 30
pages share one 2 MB content stream (~3 s of CPU a page)."""

from __future__ import annotations

import resource
import threading
import time
from dataclasses import replace

import pytest

from shared.engine.cache import RunCaches
from shared.errors import CallCancelled, ToolError
from shared.llm.abort import Abort
from shared.tools import ToolContext
from shared.tools.documents import DocumentLimits, extract
from shared.tools.files import READ_FILES
from tests.files_support import pdf_bomb, tiny_pdf


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _busy_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("tool-")]


def test_a_pdf_reads_as_pages_in_a_child() -> None:
    got = extract(tiny_pdf([["first page"], ["second page"]]), "application/pdf", "a.pdf")
    assert got.text == "--- page 1 ---\nfirst page\n\n--- page 2 ---\nsecond page"
    assert not got.truncated
    short = extract(
        tiny_pdf([["one"], ["two"], ["three"]]),
        "application/pdf",
        "a.pdf",
        DocumentLimits(max_pages=2),
    )
    assert short.truncated and "three" not in short.text


def test_the_pdf_bomb_costs_at_most_the_cpu_limit() -> None:
    bomb = pdf_bomb()
    assert len(bomb) < 13_000
    for limits in (DocumentLimits(cpu_s=2), DocumentLimits(cpu_s=5)):
        cpu_before, started = _children_cpu(), time.monotonic()
        try:
            got = extract(bomb, "application/pdf", "bomb.pdf", limits)
        except ToolError as exc:  # killed at the CPU limit
            assert "CPU" in str(exc), exc
        else:  # or stopped at the character limit
            assert got.truncated and len(got.text) <= limits.max_chars + 100
        spent = _children_cpu() - cpu_before
        assert spent <= limits.cpu_s + 1.0, spent
        assert time.monotonic() - started < limits.wall_s


def test_cancel_kills_the_reader_at_once() -> None:
    abort = Abort()
    threading.Timer(0.5, abort.cancel).start()
    started = time.monotonic()
    with pytest.raises(CallCancelled):
        extract(pdf_bomb(), "application/pdf", "bomb.pdf", DocumentLimits(cpu_s=30), abort)
    assert time.monotonic() - started < 1.5


def test_text_is_bounded_by_bytes() -> None:
    got = extract(b"x" * 5000, "text/plain", "t.txt", DocumentLimits(max_chars=1000))
    assert not got.truncated and got.text == "x" * 5000  # decoding text costs nothing
    with pytest.raises(ToolError, match="byte limit"):
        extract(b"x" * 5000, "text/plain", "t.txt", DocumentLimits(max_bytes=100))


class _Files:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.reads = 0

    def read(self, file_id: str) -> bytes:
        self.reads += 1
        return self.data


def test_read_files_on_a_bomb_is_bounded_and_leaves_nothing_running() -> None:
    ref = {"id": "f1", "name": "bomb.pdf", "content_type": "application/pdf", "size": 12_000}
    ctx = ToolContext(run_id="r", call_id="c", attachments=(ref,), files=_Files(pdf_bomb()))
    cpu_before, started = _children_cpu(), time.monotonic()
    try:
        out = READ_FILES.execute({"file": "f1"}, ctx)
    except ToolError as exc:
        assert "CPU" in str(exc)
    else:
        assert "past the reading limits" in out.text or "page 1 of" in out.text
    assert _children_cpu() - cpu_before <= 6.0
    assert time.monotonic() - started < 15
    assert _busy_threads() == []


def test_a_file_is_parsed_once_with_the_runtimes_text_cache() -> None:
    """The worker's extracted texts are on its runtime (``RunCaches.texts``), handed to the
    tool in its context; without them each call reads and parses the file again."""
    ref = {"id": "f2", "name": "a.pdf", "content_type": "application/pdf", "size": 500}
    files = _Files(tiny_pdf([["hello"]]))
    ctx = ToolContext(
        run_id="r", call_id="c", attachments=(ref,), files=files, texts=RunCaches().texts
    )
    first = READ_FILES.execute({"file": "f2"}, ctx)
    again = READ_FILES.execute({"file": "f2"}, ctx)
    assert "hello" in first.text and again.text == first.text
    assert files.reads == 1
    READ_FILES.execute({"file": "f2"}, replace(ctx, texts=None))
    assert files.reads == 2
