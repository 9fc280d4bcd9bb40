"""What a watcher knows about a run: the stored state (run, messages, tool calls, usage from
the API) overlaid with what the event stream said since (live deltas, tools started).

Pure data, no I/O and no terminal: ``scheduler.cli.watch`` feeds it events and API snapshots and
renders ``rounds()``. The stored transcript wins over deltas once a round is committed.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from scheduler.cli.client import TERMINAL, Event
from shared.isotime import epoch
from shared.vocab import EventType

__all__ = ["LiveRun", "RoundView", "ToolCard", "pause_id"]

DECLINED = "Declined by user"  # shared.engine.commands.DECLINED_TEXT (not imported: no engine here)
_SYNC_ON = (
    frozenset(
        {
            EventType.TOOL_STARTED,
            EventType.TOOL_FINISHED,
            EventType.PLAN_UPDATED,
            EventType.RUN_WAITING,
            EventType.RUN_RESUMED,
        }
    )
    | TERMINAL
)


def pause_id(pending: Mapping[str, Any] | None) -> str | None:
    """The id of a pause (an ask's ``ask_id``, an approval's ``approval_id``)."""
    if not pending:
        return None
    return str(pending.get("ask_id") or pending.get("approval_id") or "") or None


@dataclass
class ToolCard:
    call_id: str
    name: str
    arguments: str = ""
    status: str = "running"  # running | done | waiting (approval) | queued
    preview: str = ""
    error: str | None = None
    cost: float = 0.0
    started_at: float | None = None  # epoch seconds
    finished_at: float | None = None

    @property
    def declined(self) -> bool:
        """A write the person rejected (its result is the engine's decline text)."""
        return self.status == "done" and self.preview.startswith(DECLINED)

    def seconds(self, now: float | None = None) -> float | None:
        if self.started_at is None:
            return None
        end = self.finished_at or (now if now is not None else time.time())
        return max(0.0, end - self.started_at)


@dataclass
class RoundView:
    n: int
    reasoning: str = ""
    text: str = ""
    streaming: bool = False  # text/reasoning come from live deltas, not yet committed
    tools: list[ToolCard] = field(default_factory=list)
    usage: dict[str, Any] | None = None  # tokens, cost, latency of the round's model call


@dataclass
class LiveRun:
    run_id: str
    run: dict[str, Any] = field(default_factory=dict)
    messages: list[dict[str, Any]] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)
    usage: list[dict[str, Any]] = field(default_factory=list)
    cursor: int = 0  # the last durable event seen
    current_round: int = 0
    live_text: dict[int, str] = field(default_factory=dict)
    live_reasoning: dict[int, str] = field(default_factory=dict)
    started: dict[str, ToolCard] = field(default_factory=dict)  # from events, before a sync
    printed: set[int] = field(default_factory=set)  # rounds a terminal view already printed
    printed_tools: set[str] = field(default_factory=set)  # and tool calls (by call id)

    # -- input

    def apply(self, ev: Event) -> bool:
        """Take one event; True when the stored state should be fetched again."""
        if ev.seq is not None:
            self.cursor = max(self.cursor, ev.seq)
        data = ev.data
        if ev.type in (EventType.TEXT_DELTA, EventType.REASONING_DELTA):
            buf = self.live_text if ev.type == EventType.TEXT_DELTA else self.live_reasoning
            n = int(data.get("round") or self.current_round)
            buf[n] = buf.get(n, "") + str(data.get("text") or "")
            return False
        if ev.type == EventType.ROUND_STARTED:
            self.current_round = int(data.get("round") or self.current_round + 1)
            self.run["status"] = "running"
        elif ev.type == EventType.TOOL_STARTED:
            cid = str(data.get("call_id"))
            self.started[cid] = ToolCard(cid, str(data.get("name")), started_at=ev.ts)
        elif ev.type == EventType.RUN_WAITING:
            self.run.update(status="waiting", pending=data.get("pending"))
        elif ev.type in TERMINAL:
            self.run["status"] = ev.type.split(".", 1)[1]
        return ev.type in _SYNC_ON

    def sync(
        self,
        run: dict[str, Any],
        messages: list[dict[str, Any]],
        calls: list[dict[str, Any]],
        usage: list[dict[str, Any]],
    ) -> None:
        """A fresh snapshot from the API; committed rounds drop their live buffers."""
        self.run, self.messages, self.calls, self.usage = run, messages, calls, usage
        self.current_round = max(self.current_round, int(run.get("round") or 0))
        for m in messages:
            if m["role"] == "assistant":
                self.live_text.pop(m["round"], None)
                self.live_reasoning.pop(m["round"], None)
        known = {c["call_id"] for c in calls}
        self.started = {k: v for k, v in self.started.items() if k not in known}

    # -- output

    @property
    def status(self) -> str:
        return str(self.run.get("status") or "queued")

    @property
    def pending(self) -> dict[str, Any] | None:
        pending = self.run.get("pending")
        return pending if self.status == "waiting" and pending else None

    def question(self) -> str:
        first = next(
            (m for m in self.messages if m["role"] == "user" and not m.get("hidden")), None
        )
        return _text(first["content"]) if first else ""

    def rounds(self) -> list[RoundView]:
        """One view per round: stored reasoning and text (or live deltas), tools, usage."""
        views: dict[int, RoundView] = {}

        def at(n: int) -> RoundView:
            return views.setdefault(n, RoundView(n))

        for m in self.messages:
            if m["role"] == "assistant" and not m.get("kind"):
                view = at(m["round"])
                view.reasoning += m.get("reasoning") or ""
                view.text += _text(m.get("content"))
        for n in set(self.live_text) | set(self.live_reasoning):
            view = at(n)
            view.reasoning, view.text = self.live_reasoning.get(n, ""), self.live_text.get(n, "")
            view.streaming = True
        for card in [*map(_card, self.calls), *self.started.values()]:
            if card.name not in _HIDDEN_TOOLS:
                at(_round_of(card, self.calls, self.current_round)).tools.append(card)
        for u in self.usage:
            if u.get("purpose", "round") == "round":
                at(int(u["round"])).usage = u
        if self.status in ("queued", "running") and self.current_round:
            at(self.current_round)
        return [views[k] for k in sorted(views)]


_HIDDEN_TOOLS = frozenset({"ask_user", "set_plan", "update_plan", "stop"})


def _round_of(card: ToolCard, calls: list[dict[str, Any]], current: int) -> int:
    row = next((c for c in calls if c["call_id"] == card.call_id), None)
    return int(row["round"]) if row else current


def _card(row: Mapping[str, Any]) -> ToolCard:
    status = str(row.get("status") or "")
    shown = {"done": "done", "running": "running", "waiting": "waiting"}.get(status, "queued")
    return ToolCard(
        call_id=str(row["call_id"]),
        name=str(row["name"]),
        arguments=str(row["arguments"]),
        status=shown,
        preview=str(row.get("result") or "")[:300],
        error=row.get("error"),
        cost=float(row.get("cost") or 0.0),
        started_at=_epoch(row.get("started_at")),
        finished_at=_epoch(row.get("finished_at")) if status == "done" else None,
    )


def _text(content: Any) -> str:
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return str(content or "")


def _epoch(value: Any) -> float | None:
    """An API time (ISO 8601) as epoch seconds, for durations."""
    return epoch(value) if isinstance(value, str) else None
