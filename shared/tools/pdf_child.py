"""The PDF text extractor's child process (runs as a script: ``python -I pdf_child.py CONFIG``;
standard library and pypdf only; never imported by treadle itself).

A PDF is untrusted input whose parsing can cost minutes of CPU and gigabytes of memory (one
content stream shared by every page, deep object graphs). This process limits itself before
it reads a byte — CPU seconds, address space, no core dumps — reads the PDF from stdin, and
writes one JSON object to stdout: ``{"pages": [...], "page_count": N, "truncated": bool}``
(``truncated``: it stopped at the page or character limit) or ``{"error": "..."}``. Going
over the CPU limit kills it (SIGXCPU, then SIGKILL); the parent reports that.
"""

from __future__ import annotations

import io
import json
import resource
import sys
from typing import Any


def _limit(cfg: dict[str, Any]) -> None:
    cpu = max(1, int(cfg["cpu_s"]))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    memory = int(cfg["memory_bytes"])
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _extract(data: bytes, cfg: dict[str, Any]) -> dict[str, Any]:
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    max_pages, max_chars = int(cfg["max_pages"]), int(cfg["max_chars"])
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            return {"error": "an encrypted PDF"}
        count = len(reader.pages)
        pages: list[str] = []
        chars = 0
        for page in reader.pages[:max_pages]:
            text = (page.extract_text() or "").strip()
            pages.append(text[: max_chars - chars])
            chars += len(pages[-1])
            if chars >= max_chars:
                break
    except (PdfReadError, ValueError, KeyError, TypeError, RecursionError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:500]}
    truncated = len(pages) < count or chars >= max_chars
    return {"pages": pages, "page_count": count, "truncated": truncated}


def main() -> None:
    cfg = json.loads(sys.argv[1])
    _limit(cfg)
    data = sys.stdin.buffer.read(int(cfg["max_bytes"]) + 1)
    if len(data) > int(cfg["max_bytes"]):
        result: dict[str, Any] = {"error": f"over {cfg['max_bytes']} bytes"}
    else:
        try:
            result = _extract(data, cfg)
        except MemoryError:
            result = {"error": "over the memory limit"}
    sys.stdout.write(json.dumps(result))


if __name__ == "__main__":
    main()
