"""Progress from tools: what a tool reports as it runs (``ToolContext.progress``: a plugin's
call, an HTTP tool's streamed progress, an MCP server's progress notifications) goes to the
run's live stream as ``tool.progress`` events — ephemeral, as model deltas are: never stored,
not replayed on reconnect, not a webhook. The SSE stream, the console and the LangGraph
facade's ``custom`` mode show them.

Bounded per call: at most ``MAX_REPORTS`` reports (the rest are dropped), messages cut to
``MAX_MESSAGE`` characters, numbers finite and not negative (else left out).
"""

from __future__ import annotations

import itertools
import math
import threading
from typing import Any, Final

from shared.engine.runtime import Runtime
from shared.store.rows import Call
from shared.tools.base import ProgressSink
from shared.vocab import EventType

__all__ = ["MAX_MESSAGE", "MAX_REPORTS", "progress_sink"]

MAX_REPORTS: Final = 1000
MAX_MESSAGE: Final = 500


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def progress_sink(rt: Runtime, run_id: str, call: Call) -> ProgressSink:
    """A sink that publishes the call's progress on the run's live channel, numbered from 1
    (``seq``: a client sees the order even if it joins late)."""
    numbers = itertools.count(1)
    lock = threading.Lock()  # a tool may report from its own threads

    def sink(progress: float | None, total: float | None, message: str | None) -> None:
        with lock:
            n = next(numbers)
        if n > MAX_REPORTS:
            return
        data: dict[str, Any] = {
            "call_id": call.call_id,
            "name": call.name,
            "round": call.round,
            "seq": n,
        }
        if (p := _number(progress)) is not None:
            data["progress"] = p
        if (t := _number(total)) is not None:
            data["total"] = t
        if isinstance(message, str) and message:
            data["message"] = message[:MAX_MESSAGE]
        rt.live.publish(run_id, {"type": EventType.TOOL_PROGRESS.value, "data": data})

    return sink
