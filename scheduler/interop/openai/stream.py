"""An OpenAI response from one segment's treadle events: the Response object
and its stream events, both from one fold, so ``retrieve`` and the stream agree.

``sequence_number`` is stable across reconnects although deltas are not stored: the k-th event
of durable event s is ``s·10⁶ + k``; a round's message item is added at ``r·10⁶ + 998`` (r: the
seq of the round's ``round.started``), whether at its first live delta or, when replaying, at
its commit; a live text delta is ``r·10⁶ + 1000 + offset`` (its place in the reply). Replays
re-add items at the same numbers and never replay deltas; the ``done`` events carry the text.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.agent.messages import content_text
from shared.interop.shapes import INCOMPLETE
from shared.vocab import EventType

__all__ = ["M", "Facts", "ResponseFold", "Start", "StreamEvent"]

M = 1_000_000
ADDED_AT, PART_AT, DELTA_AT = 998, 999, 1000
StreamEvent = tuple[int, dict[str, Any]]  # (sequence_number, event without it)
Row = Mapping[Any, Any]


@dataclass(frozen=True)
class Start:
    """What the fold needs to know about its segment."""

    response_id: str
    run_id: str
    model: str
    created_at: float
    from_seq: int
    start_ts: float | None  # the resumed run.waiting's time; None at the run's start
    previous_response_id: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    background: bool = True


@dataclass(frozen=True)
class Facts:
    """What the stored run says now: its messages, its tool calls, its usage by rounds (read
    on the caller's connection)."""

    rows: Sequence[Row]
    tools: Mapping[str, Row]
    usage: Callable[[set[int]], dict[str, int]]


@dataclass
class _Text:
    index: int
    item_id: str
    text: str = ""


class ResponseFold:
    """Feed it the segment's durable events (``durable``) and live deltas (``delta``); it
    returns the stream events each one expands to and keeps the Response object."""

    def __init__(self, start: Start) -> None:
        self.s = start
        self.totals: dict[str, int] | None = None  # token usage, once the segment ended
        self.items: dict[int, dict[str, Any]] = {}
        self.texts: dict[int, _Text] = {}  # round → its message item
        self.round_seq: dict[int, int] = {}
        self.observed: set[int] = set()
        self.calls: dict[str, str] = {}  # call id → arguments (from the assistant messages)
        self.status = "queued" if start.from_seq == 0 else "in_progress"
        self.end: Row | None = None
        self.in_progress = start.from_seq != 0
        self.last = -1

    # --- the Response object -------------------------------------------------------------

    def response(self) -> dict[str, Any]:
        err, end = None, self.end
        data = dict(end["data"] or {}) if end is not None else {}
        if self.status == "failed":
            e = data.get("error") or {}
            err = {"code": "server_error", "message": str(e.get("message") or "the run failed")}
        incomplete = {"reason": data.get("stop_reason")} if self.status == "incomplete" else None
        return {
            "id": self.s.response_id,
            "object": "response",
            "created_at": int(self.s.created_at),
            "status": self.status,
            "background": self.s.background,
            "model": self.s.model,
            "previous_response_id": self.s.previous_response_id,
            "error": err,
            "incomplete_details": incomplete,
            "metadata": self.s.metadata,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "output": [self.items[i] for i in sorted(self.items)],
            "usage": self._usage(),
            "instructions": None,
            "temperature": None,
            "top_p": None,
            "store": True,
            "text": {"format": {"type": "text"}},
            "truncation": "disabled",
        }

    def _usage(self) -> dict[str, Any] | None:
        u = self.totals
        if u is None:
            return None
        return {
            "input_tokens": u["input_tokens"],
            "input_tokens_details": {
                "cached_tokens": u["cached_input_tokens"],
                "cache_write_tokens": 0,
            },
            "output_tokens": u["output_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u["input_tokens"] + u["output_tokens"],
        }

    # --- expansion -----------------------------------------------------------------------

    def begin(self, rows: Sequence[Row]) -> list[StreamEvent]:
        """``response.created`` (and ``queued``); messages before the segment are not its."""
        if self.s.start_ts is not None:
            self.observed.update(r["seq"] for r in rows if r["created_at"] <= self.s.start_ts)
        base = self.s.from_seq * M
        out = [self._ev(base + 1, "response.created", response=self._lifecycle())]
        if self.s.from_seq == 0:
            out.append(self._ev(base + 2, "response.queued", response=self._lifecycle()))
        return out

    def durable(self, ev: Row, facts: Facts) -> list[StreamEvent]:
        rows = facts.rows
        n = _Counter(int(ev["seq"]) * M)
        out: list[StreamEvent] = []
        kind, data = ev["type"], dict(ev["data"] or {})
        if kind == EventType.ROUND_STARTED:
            self.round_seq[int(data.get("round") or 0)] = int(ev["seq"])
        if kind in (EventType.ROUND_STARTED, EventType.TOOL_STARTED) and not self.in_progress:
            self.in_progress, self.status = True, "in_progress"
            out.append(self._ev(n(), "response.in_progress", response=self._lifecycle()))
        new = [
            r for r in rows if r["seq"] not in self.observed and r["created_at"] <= ev["created_at"]
        ]
        self.observed.update(r["seq"] for r in new)
        for row in new:
            out += self._message(row, facts.tools, n)
        if kind in (
            EventType.RUN_WAITING,
            EventType.RUN_COMPLETED,
            EventType.RUN_FAILED,
            EventType.RUN_CANCELLED,
        ):
            self.totals = facts.usage(set(self.round_seq))
        out += self._ending(ev, kind, data, n)
        return self._keep(out)

    def delta(self, kind: str, data: Mapping[str, Any]) -> list[StreamEvent]:
        round_ = int(data.get("round") or 0)
        base = self.round_seq.get(round_)
        if kind != EventType.TEXT_DELTA or base is None or self.end is not None:
            return []
        out = self._open_text(round_, (base * M + ADDED_AT, base * M + PART_AT))
        text, t = str(data.get("text") or ""), self.texts[round_]
        t.text += text
        offset = min(int(data.get("offset") or 0), M - DELTA_AT - 1)
        out.append(
            self._text_ev(
                base * M + DELTA_AT + offset,
                "response.output_text.delta",
                t,
                delta=text,
                logprobs=[],
            )
        )
        return self._keep(out)

    # --- pieces --------------------------------------------------------------------------

    def _keep(self, out: list[StreamEvent]) -> list[StreamEvent]:
        """Strictly increasing numbers (a retried round can repeat a delta's)."""
        kept = []
        for num, payload in out:
            if num > self.last:
                self.last = num
                kept.append((num, payload))
        return kept

    def _ev(self, num: int, type_: str, **fields: Any) -> StreamEvent:
        return num, {"type": type_, **fields, "sequence_number": num}

    def _text_ev(self, num: int, type_: str, t: _Text, **fields: Any) -> StreamEvent:
        """An event of a message's text part (its item, its output index, part 0)."""
        return self._ev(
            num, type_, item_id=t.item_id, output_index=t.index, content_index=0, **fields
        )

    def _lifecycle(self) -> dict[str, Any]:
        snap = self.response()
        snap["output"] = []
        return snap

    def _alloc(self, item: dict[str, Any]) -> int:
        index = len(self.items)
        self.items[index] = item
        return index

    def _open_text(self, round_: int, at: tuple[int, int]) -> list[StreamEvent]:
        """Add the round's message item and its text part (once), at the numbers ``at``."""
        if round_ in self.texts:
            return []
        item_id = f"msg_{self.s.run_id.removeprefix('run_')}_{round_}"
        item = {
            "type": "message",
            "id": item_id,
            "role": "assistant",
            "status": "in_progress",
            "content": [],
        }
        index = self._alloc(item)
        t = self.texts[round_] = _Text(index, item_id)
        part = {"type": "output_text", "text": "", "annotations": []}
        return [
            self._ev(at[0], "response.output_item.added", output_index=index, item=dict(item)),
            self._text_ev(at[1], "response.content_part.added", t, part=part),
        ]

    def _message(self, row: Row, tools: Mapping[str, Row], n: _Counter) -> list[StreamEvent]:
        if row["hidden"] or row["kind"]:
            return []
        if row["role"] == "assistant":
            return self._assistant(row, n)
        if row["role"] == "tool":
            return self._tool_result(row, tools, n)
        return []

    def _assistant(self, row: Row, n: _Counter) -> list[StreamEvent]:
        for call in row["tool_calls"] or []:
            self.calls[str(call["id"])] = str(call.get("arguments") or "{}")
        round_, text = int(row["round"]), content_text(row["content"])
        out: list[StreamEvent] = []
        if text and round_ not in self.texts:
            base = self.round_seq.get(round_)
            at = (base * M + ADDED_AT, base * M + PART_AT) if base is not None else (n(), n())
            out += self._open_text(round_, at)
        if row["reasoning"]:
            item = {
                "type": "reasoning",
                "id": f"rs_{self.s.run_id.removeprefix('run_')}_{round_}",
                "summary": [{"type": "summary_text", "text": row["reasoning"]}],
            }
            out += self._whole(item, n)
        if text:
            out += self._close_text(round_, text, n)
        return out

    def _close_text(self, round_: int, text: str, n: _Counter) -> list[StreamEvent]:
        t = self.texts[round_]
        part = {"type": "output_text", "text": text, "annotations": []}
        item = {
            "type": "message",
            "id": t.item_id,
            "role": "assistant",
            "status": "completed",
            "content": [part],
        }
        self.items[t.index] = item
        return [
            self._text_ev(n(), "response.output_text.done", t, text=text, logprobs=[]),
            self._text_ev(n(), "response.content_part.done", t, part=part),
            self._ev(n(), "response.output_item.done", output_index=t.index, item=item),
        ]

    def _whole(self, item: dict[str, Any], n: _Counter) -> list[StreamEvent]:
        """An item that is added and done at once."""
        index = self._alloc(item)
        return [
            self._ev(n(), "response.output_item.added", output_index=index, item=item),
            self._ev(n(), "response.output_item.done", output_index=index, item=item),
        ]

    def _tool_result(self, row: Row, tools: Mapping[str, Row], n: _Counter) -> list[StreamEvent]:
        call_id, name = str(row["tool_call_id"]), str(row["name"] or "")
        call = tools.get(call_id)
        declined = call is not None and (call["data"] or {}).get("approved") is False
        if name == "ask_user" or declined:
            return []  # the client's own answer, or a write it declined
        arguments = self.calls.get(call_id) or (call["arguments"] if call is not None else "{}")
        item = {
            "type": "mcp_call",
            "id": f"mcp_{call_id}",
            "server_label": "treadle",
            "name": name,
            "arguments": arguments,
            "output": content_text(row["content"]),
            "error": None,
            "status": "completed",
        }
        return self._whole(item, n)

    def _ending(self, ev: Row, kind: str, data: dict[str, Any], n: _Counter) -> list[StreamEvent]:
        if kind not in (
            EventType.RUN_WAITING,
            EventType.RUN_COMPLETED,
            EventType.RUN_FAILED,
            EventType.RUN_CANCELLED,
        ):
            return []
        out: list[StreamEvent] = []
        if kind == EventType.RUN_WAITING:
            out += self._pause(data.get("pending") or {}, n)
        self.end = ev
        self.status = _status(kind, data)
        if kind == EventType.RUN_CANCELLED:
            return out  # no stream event for a cancel: the stream just ends
        type_ = {"failed": "response.failed", "incomplete": "response.incomplete"}.get(
            self.status, "response.completed"
        )
        return [*out, self._ev(n(), type_, response=self.response())]

    def _pause(self, pending: Mapping[str, Any], n: _Counter) -> list[StreamEvent]:
        if pending.get("kind") == "ask":
            ask_id = str(pending.get("ask_id"))
            args = {"reason": pending.get("reason", ""), "questions": pending.get("questions", [])}
            item = {
                "type": "function_call",
                "id": f"fc_{ask_id}",
                "call_id": ask_id,
                "name": "ask_user",
                "arguments": json.dumps(args, ensure_ascii=False),
                "status": "completed",
            }
            return self._whole(item, n)
        out: list[StreamEvent] = []
        for it in pending.get("items") or []:
            item = {
                "type": "mcp_approval_request",
                "id": f"mcpr_{it['call_id']}",
                "server_label": "treadle",
                "name": it["tool"],
                "arguments": json.dumps(it.get("arguments") or {}, ensure_ascii=False),
            }
            out += self._whole(item, n)
        return out


def _status(kind: str, data: Mapping[str, Any]) -> str:
    if kind == EventType.RUN_FAILED:
        return "failed"
    if kind == EventType.RUN_CANCELLED:
        return "cancelled"
    if kind == EventType.RUN_COMPLETED and data.get("stop_reason") in INCOMPLETE:
        return "incomplete"
    return "completed"


class _Counter:
    """``s·10⁶ + k`` for k = 0, 1, 2, ... (the k-th event of durable event s)."""

    def __init__(self, base: int) -> None:
        self.base, self.k = base, 0

    def __call__(self) -> int:
        self.k += 1
        return self.base + self.k - 1
