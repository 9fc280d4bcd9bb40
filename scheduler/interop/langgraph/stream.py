"""A LangGraph run's stream: one segment's treadle events as LangGraph SSE.

Every durable event expands to the requested modes' events (``values`` = the thread as of that
event; ``updates`` = what it added; ``messages`` = chunks live, whole messages otherwise); the
last SSE event of an expansion carries ``id: <seq>``, so ``Last-Event-ID`` replays after it.
Values are computed from the stored messages as of the event's commit time, so a replay from
any id sends what the live stream sent (deltas aside: they are never stored).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from scheduler.interop.common import sse
from shared.interop.shapes import ai_id, interrupt_of, lc_messages
from shared.vocab import EventType

__all__ = ["ALL_MODES", "LgStream", "modes_of"]

ALL_MODES = frozenset({"values", "updates", "messages-tuple", "messages", "events", "custom"})
DEFAULT_MODES = ("values",)
Out = list[tuple[str, Any]]


def modes_of(
    requested: str | Iterable[str] | None, stored: Iterable[str] | None = None
) -> list[str]:
    """The stream modes: a string or a list; empty = the run's own (default values)."""
    if isinstance(requested, str):
        requested = [requested]
    modes = [m for m in (requested or []) if m]
    if not modes:
        modes = [m for m in (stored or []) if m] or list(DEFAULT_MODES)
    return [m for m in dict.fromkeys(modes) if m in ALL_MODES]


class LgStream:
    """Expands one segment's events for a set of modes. ``prev``: the thread's messages as of
    the event before the first one to expand (None at the segment's start)."""

    def __init__(
        self, segment_id: str, run_id: str, modes: Iterable[str], prev: list[dict[str, Any]] | None
    ) -> None:
        self.segment_id, self.run_id = segment_id, run_id
        self.modes = set(modes)
        self.prev = prev
        self.streamed: set[str] = set()  # ai message ids whose chunks this stream sent

    def metadata(self) -> str:
        return sse("metadata", {"run_id": self.segment_id, "attempt": 1})

    def durable(self, ev: Mapping[str, Any], rows: Sequence[Mapping[Any, Any]]) -> str:
        """The SSE text for one durable event (empty when no mode wants it)."""
        snap = lc_messages(rows, self.run_id, upto=ev["created_at"])
        out = self._expand(ev, snap)
        self.prev = snap
        return "".join(
            sse(name, data, ev["seq"] if i == len(out) - 1 else None)
            for i, (name, data) in enumerate(out)
        )

    def delta(self, kind: str, data: Mapping[str, Any]) -> str:
        if kind != EventType.TEXT_DELTA:
            custom = "custom" in self.modes
            return sse("custom", {"type": kind, "data": dict(data)}) if custom else ""
        msg_id = ai_id(self.run_id, int(data.get("round") or 0))
        self.streamed.add(msg_id)
        chunk = _chunk(msg_id, str(data.get("text") or ""))
        parts: Out = []
        if self.modes & {"messages-tuple", "messages"}:
            parts.append(("messages", [chunk, self._meta(int(data.get("round") or 0))]))
        if "events" in self.modes:
            parts.append(("events", self._event("on_chat_model_stream", "agent", {"chunk": chunk})))
        if "custom" in self.modes:
            parts.append(("custom", {"type": kind, "data": dict(data)}))
        return "".join(sse(n, d) for n, d in parts)

    def _expand(self, ev: Mapping[str, Any], snap: list[dict[str, Any]]) -> Out:
        prev_ids = [m["id"] for m in self.prev] if self.prev is not None else None
        new = [m for m in snap if prev_ids is None or m["id"] not in set(prev_ids)]
        interrupt = _interrupt(ev)
        out: Out = []
        if "values" in self.modes and (prev_ids != [m["id"] for m in snap] or _ends(ev)):
            out.append(("values", _values(snap, interrupt)))
        if "updates" in self.modes:
            out += _updates(new, interrupt)
        elif interrupt is not None and "values" not in self.modes:
            out.append(("values", {"__interrupt__": [interrupt]}))
        if self.modes & {"messages-tuple", "messages"}:
            out += [
                ("messages", [m, self._meta(ev["seq"])])
                for m in new
                if m["type"] == "tool" or (m["type"] == "ai" and m["id"] not in self.streamed)
            ]
        out += self._extra(ev)
        return out

    def _extra(self, ev: Mapping[str, Any]) -> Out:
        out: Out = []
        data = dict(ev["data"] or {})
        if "events" in self.modes and ev["type"] in (
            EventType.TOOL_STARTED,
            EventType.TOOL_FINISHED,
        ):
            kind = "on_tool_start" if ev["type"] == EventType.TOOL_STARTED else "on_tool_end"
            body = {"input": {}} if kind == "on_tool_start" else {"output": data.get("preview")}
            out.append(("events", self._event(kind, str(data.get("name") or "tool"), body)))
        if "custom" in self.modes:
            out.append(("custom", {"seq": ev["seq"], "type": ev["type"], "data": data}))
        if ev["type"] == EventType.RUN_FAILED:
            err = data.get("error") or {}
            out.append(
                (
                    "error",
                    {
                        "error": str(err.get("code") or "Error"),
                        "message": str(err.get("message") or "the run failed"),
                    },
                )
            )
        return out

    def _meta(self, step: int) -> dict[str, Any]:
        return {"langgraph_node": "agent", "langgraph_step": step, "run_id": self.segment_id}

    def _event(self, kind: str, name: str, data: dict[str, Any]) -> dict[str, Any]:
        return {
            "event": kind,
            "name": name,
            "run_id": self.segment_id,
            "data": data,
            "metadata": {"langgraph_node": "agent"},
            "tags": [],
            "parent_ids": [],
        }


def _ends(ev: Mapping[str, Any]) -> bool:
    return ev["type"] in (
        EventType.RUN_WAITING,
        EventType.RUN_COMPLETED,
        EventType.RUN_FAILED,
        EventType.RUN_CANCELLED,
    )


def _interrupt(ev: Mapping[str, Any]) -> dict[str, Any] | None:
    if ev["type"] != EventType.RUN_WAITING:
        return None
    return interrupt_of((ev["data"] or {}).get("pending") or {})


def _values(snap: list[dict[str, Any]], interrupt: dict[str, Any] | None) -> dict[str, Any]:
    values: dict[str, Any] = {"messages": snap}
    if interrupt is not None:
        values["__interrupt__"] = [interrupt]
    return values


def _updates(new: list[dict[str, Any]], interrupt: dict[str, Any] | None) -> Out:
    out: Out = []
    ai = [m for m in new if m["type"] == "ai"]
    tools = [m for m in new if m["type"] == "tool"]
    if ai:
        out.append(("updates", {"agent": {"messages": ai}}))
    if tools:
        out.append(("updates", {"tools": {"messages": tools}}))
    if interrupt is not None:
        out.append(("updates", {"__interrupt__": [interrupt]}))
    return out


def _chunk(msg_id: str, text: str) -> dict[str, Any]:
    return {
        "type": "AIMessageChunk",
        "id": msg_id,
        "content": text,
        "name": None,
        "additional_kwargs": {},
        "response_metadata": {},
        "tool_calls": [],
        "invalid_tool_calls": [],
        "tool_call_chunks": [],
        "usage_metadata": None,
    }
