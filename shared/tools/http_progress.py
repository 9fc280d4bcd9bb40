"""An HTTP tool's progress, from a streamed body (docs/api.md, "Progress from tools").

An endpoint that answers ``Content-Type: text/event-stream`` streams Server-Sent Events:
each ``event: progress`` frame (``data: {"progress": 3, "total": 10, "message": "..."}``) is
reported as it arrives (``ToolContext.progress``: the run's ``tool.progress``); the data of
the other frames (``event: result``, or no event name), joined by newlines, is the tool's
result. The whole body stays within the tool's size limit.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from shared.tools.base import ToolContext
from shared.tools.netguard import Watch

__all__ = ["EVENT_STREAM", "SseProgress", "is_event_stream", "progress_watch", "sse_result"]

EVENT_STREAM = "text/event-stream"
PROGRESS_EVENT = "progress"


def is_event_stream(headers: httpx.Headers) -> bool:
    kind = str(headers.get("content-type", ""))
    return kind.split(";", 1)[0].strip().lower() == EVENT_STREAM


def _frame(raw: str) -> tuple[str | None, str]:
    """One SSE frame: its event name (None: a plain message) and its data lines joined."""
    event: str | None = None
    data: list[str] = []
    for line in raw.split("\n"):
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "event":
            event = value.strip() or None
        elif field == "data":
            data.append(value)
    return event, "\n".join(data)


class SseProgress:
    """Fed the body as it arrives: reports each complete ``progress`` frame."""

    def __init__(self, ctx: ToolContext) -> None:
        self.ctx = ctx
        self.buf = b""

    def __call__(self, chunk: bytes) -> None:
        self.buf = (self.buf + chunk).replace(b"\r\n", b"\n")
        while b"\n\n" in self.buf:
            raw, self.buf = self.buf.split(b"\n\n", 1)
            event, data = _frame(raw.decode("utf-8", errors="replace"))
            if event == PROGRESS_EVENT:
                self._report(data)

    def _report(self, data: str) -> None:
        try:
            body: Any = json.loads(data)
        except ValueError:
            body = {"message": data}
        if not isinstance(body, dict):
            body = {"progress": body}
        message = body.get("message")
        self.ctx.progress(
            body.get("progress"), body.get("total"), message if isinstance(message, str) else None
        )


def progress_watch(ctx: ToolContext) -> Watch:
    """What ``safe_request`` calls with the response's headers: an event stream is read
    for progress frames as it arrives."""

    def watch(headers: httpx.Headers) -> SseProgress | None:
        return SseProgress(ctx) if is_event_stream(headers) else None

    return watch


def sse_result(text: str) -> str:
    """The result in an event stream: the data of its frames other than progress."""
    frames = [_frame(raw) for raw in text.replace("\r\n", "\n").split("\n\n") if raw.strip()]
    return "\n".join(data for event, data in frames if event != PROGRESS_EVENT and data)
