"""``read_files``: the loop's system tool for the run's attachments (SPEC M-11: file reading
is a system tool of the loop).

Text and markdown come back as they are, PDFs as extracted text (pypdf, in a child process
with CPU, memory, page and character limits: ``shared.tools.documents``), in pages of about
``PAGE_CHARS`` characters with the page range in the result. The tool is not in the registry
(``read_files`` is a reserved name): the catalog adds it to a run that has attachments.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, Field

from shared.errors import ToolError
from shared.llm.abort import Abort
from shared.tools.base import FunctionTool, ToolContext, ToolResult
from shared.tools.documents import DocumentLimits, extract

__all__ = [
    "PAGE_CHARS",
    "READ_FILES",
    "TEXT_CACHE_SIZE",
    "ReadFilesArgs",
    "TextCache",
    "describe_files",
    "extract_text",
    "page_spans",
    "read_files",
]

PAGE_CHARS = 8000
TEXT_CACHE_SIZE = 8  # files whose text a process keeps (``TextCache``)


class ReadFilesArgs(BaseModel):
    file: str | None = Field(
        default=None, description="The file's name or id; omit it to list the attached files."
    )
    page: int = Field(default=1, ge=1, description="Page of a long file (1 = the first).")


def page_spans(text: str, size: int = PAGE_CHARS) -> list[tuple[int, int]]:
    """Split ``text`` into pages of at most ``size`` characters, cut at a line break in the
    last fifth of a page when there is one. Deterministic, so page N is always the same."""
    spans: list[tuple[int, int]] = []
    start = 0
    while start < len(text) or not spans:
        end = min(start + size, len(text))
        if end < len(text):
            cut = text.rfind("\n", start + size * 4 // 5, end)
            end = cut + 1 if cut >= 0 else end
        spans.append((start, end))
        start = end
    return spans


class TextCache:
    """Extracted text by tenant and file id (files are immutable): a PDF is parsed once per
    worker. The process's is on its runtime (``RunCaches.texts``), given to the tool in its
    ``ToolContext``."""

    def __init__(self, size: int) -> None:
        self._items: OrderedDict[str, str] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def get(self, key: str) -> str | None:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
            return self._items.get(key)

    def put(self, key: str, text: str) -> None:
        with self._lock:
            self._items[key] = text
            self._items.move_to_end(key)
            while len(self._items) > self._size:
                self._items.popitem(last=False)


def extract_text(
    data: bytes,
    content_type: str,
    name: str = "file",
    abort: Abort | None = None,
    ctx: ToolContext | None = None,
) -> str:
    """A file's text within the operator's document limits (``shared.tools.documents``); a
    note at the end when a limit cut it short. ``ctx``: the call's (its tenant waits for one
    of the process's slots, ``ctx.confinement``)."""
    confinement, tenant = (ctx.confinement, ctx.tenant) if ctx is not None else (None, "default")
    found = extract(data, content_type, name, _limits(), abort, confinement, tenant)
    if not found.truncated:
        return found.text
    return f"{found.text}\n\n[... the rest of {name} is past the reading limits and not shown]"


def _limits() -> DocumentLimits:
    from shared.config import get_settings

    return DocumentLimits.from_settings(get_settings())


def _find(refs: Sequence[Mapping[str, Any]], wanted: str) -> Mapping[str, Any]:
    """By id, then exact name, then case-insensitive name; ambiguity is an error."""
    by_id = [r for r in refs if r["id"] == wanted]
    exact = [r for r in refs if r.get("name") == wanted]
    loose = [r for r in refs if str(r.get("name", "")).lower() == wanted.strip().lower()]
    for hits in (by_id, exact, loose):
        if len(hits) == 1:
            return hits[0]
        if len(hits) > 1:
            ids = ", ".join(str(r["id"]) for r in hits)
            raise ToolError(f"several attached files are named {wanted!r}; use an id: {ids}")
    raise ToolError(f"no attached file {wanted!r}. {describe_files(refs)}")


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    return f"{n / 1024:.1f} KB" if n < 1 << 20 else f"{n / (1 << 20):.1f} MB"


def describe_files(refs: Sequence[Mapping[str, Any]]) -> str:
    lines = [
        f"- {r.get('name') or r['id']} (id {r['id']}, {r.get('content_type') or '?'}, "
        f"{_size(int(r.get('size') or 0))})"
        for r in refs
    ]
    return "Attached files:\n" + "\n".join(lines) if lines else "No files are attached."


def _text_of(ref: Mapping[str, Any], ctx: ToolContext) -> str:
    key = f"{ctx.tenant}:{ref['id']}"
    cached = ctx.texts.get(key) if ctx.texts is not None else None
    if cached is not None:
        return cached
    if ctx.files is None:
        raise ToolError("this run's files cannot be read here")
    try:
        data = ctx.files.read(str(ref["id"]))
    except FileNotFoundError as exc:
        raise ToolError(str(exc)) from None
    kind, name = str(ref.get("content_type") or ""), str(ref.get("name") or "")
    text = extract_text(data, kind, name, ctx.abort, ctx)
    if ctx.texts is not None:
        ctx.texts.put(key, text)
    return text


def read_files(args: ReadFilesArgs, ctx: ToolContext) -> ToolResult:
    """Read a file attached to this run (text, markdown, PDF as text), one page of about
    8,000 characters at a time; without `file`, list the attached files."""
    if not args.file:
        return ToolResult(text=describe_files(ctx.attachments))
    ref = _find(ctx.attachments, args.file)
    text = _text_of(ref, ctx)
    spans = page_spans(text)
    if args.page > len(spans):
        raise ToolError(
            f"{ref.get('name')} has {len(spans)} page(s); page {args.page} is past the end"
        )
    start, end = spans[args.page - 1]
    head = (
        f"[{ref.get('name')} ({ref.get('content_type')}): page {args.page} of {len(spans)}, "
        f"characters {start + 1}-{end} of {len(text)}]"
    )
    more = (
        f"\n[... continued: call read_files with page={args.page + 1}]"
        if args.page < len(spans)
        else ""
    )
    data = {
        "file_id": ref["id"],
        "page": args.page,
        "pages": len(spans),
        "start": start,
        "end": end,
        "chars": len(text),
    }
    return ToolResult(text=f"{head}\n{text[start:end]}{more}", data=data)


READ_FILES: FunctionTool[ReadFilesArgs] = FunctionTool.from_function(
    read_files, name="read_files", read_only=True
)
