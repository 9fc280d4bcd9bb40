"""``treadle watch``: a run followed live over SSE in a terminal (rich Live).

Reasoning is dimmed, answer text streams as it arrives, tools are cards with a spinner while
they run and their timing after, the plan is a checklist, tokens and cost tick with every
commit. ``follow`` stops at a pause (``waiting``) or at the end; in a terminal the caller
answers the pause and follows on (``scheduler.cli.interactive``).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.live import Live
from rich.markup import escape
from rich.panel import Panel
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from scheduler.cli.client import FINAL, TERMINAL, ApiClient, Event
from scheduler.cli.livestate import LiveRun, RoundView, ToolCard, pause_id
from scheduler.cli.render import pending_view, plan_view
from shared.vocab import EventType

__all__ = ["STATUS_STYLE", "RunPanel", "follow", "model_name"]

STATUS_STYLE = {
    "completed": "green",
    "failed": "red",
    "cancelled": "yellow",
    "waiting": "magenta",
    "running": "cyan",
    "queued": "blue",
    "scheduled": "bright_black",
}
_MIN_SYNC_S = 0.2


def _args_preview(arguments: str, width: int = 90) -> str:
    try:
        parsed = json.loads(arguments or "{}")
        text = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in parsed.items())
    except (ValueError, AttributeError):
        text = arguments
    return text if len(text) <= width else text[: width - 1] + "…"


def _spinner(text: RenderableType = "") -> Spinner:
    """A spinner whose frame follows the clock: the live region is rebuilt on every refresh,
    so a fresh spinner (first frame each time) would never turn."""
    spinner = Spinner("dots", text=text, style="cyan")
    spinner.start_time = 0.0
    return spinner


def _seconds(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.1f} s"


def _tool_line(card: ToolCard, now: float) -> RenderableType:
    head = Text.assemble(
        (card.name, "bold"), ("(", "dim"), (_args_preview(card.arguments), ""), (")", "dim")
    )
    timing = Text(_seconds(card.seconds(now)), style="dim")
    if card.status == "running":
        mark: RenderableType = _spinner()
    elif card.status == "waiting":
        mark = Text("⏸", style="magenta")
    elif card.status == "queued":
        mark = Text("…", style="dim")
    elif card.declined:
        mark = Text("⊘", style="yellow")
    else:
        mark = Text("✖" if card.error else "✔", style="red" if card.error else "green")
    grid = Table.grid(padding=(0, 1), expand=True)
    grid.add_column(width=2)
    grid.add_column(ratio=1)
    grid.add_column(justify="right", no_wrap=True)
    grid.add_row(mark, head, timing)
    result = card.error or card.preview
    if card.status == "done" and result:
        style = "red" if card.error else "yellow" if card.declined else "dim"
        grid.add_row("", Text("→ " + result.replace("\n", " ")[:200], style=style), "")
    return grid


def _round_header(view: RoundView) -> Text:
    line = Text(f"round {view.n}", style="bold blue")
    u = view.usage
    if u:
        line.append(
            f"  {u['input_tokens']}→{u['output_tokens']} tok  ${u['cost']:.6f}"
            f"  {_seconds((u.get('latency_ms') or 0) / 1000)}",
            style="dim",
        )
    elif view.streaming:
        line.append("  streaming…", style="dim cyan")
    return line


def _round(
    view: RoundView, now: float, tools: list[ToolCard] | None = None
) -> list[RenderableType]:
    """A round: header, dimmed reasoning, answer text, and ``tools`` (default: all)."""
    out: list[RenderableType] = [_round_header(view)]
    if view.reasoning:
        out.append(Text(view.reasoning.strip(), style="dim italic"))
    if view.text:
        out.append(Text(view.text.strip() + (" ▌" if view.streaming else "")))
    elif view.streaming or (not view.tools and view.usage is None):
        out.append(_spinner(Text("thinking", style="dim")))
    out.extend(_tool_line(card, now) for card in (view.tools if tools is None else tools))
    return out


def model_name(agent: dict[str, Any]) -> str:
    """A spec's model as people call it: the profile name, or an inline profile's model."""
    model = agent.get("model") or "demo"
    if isinstance(model, str):
        return model
    name = model.get("name")
    return str(name if name and name != "inline" else model.get("model") or "inline")


def _wall_seconds(run: dict[str, Any]) -> float:
    """How long the run has taken: created → updated when it ended, → now while it runs."""
    from datetime import UTC, datetime

    def parse(iso: str) -> datetime:
        return datetime.fromisoformat(iso.replace("Z", "+00:00"))

    if not run.get("created_at"):
        return 0.0
    end = parse(run["updated_at"]) if run.get("status") in FINAL else datetime.now(UTC)
    return max(0.0, (end - parse(run["created_at"])).total_seconds())


def _status_bar(state: LiveRun) -> Text:
    run, status = state.run, state.status
    usage = run.get("usage") or {}
    agent = run.get("agent") or {}
    rnd = max(int(run.get("round") or 0), state.current_round)
    return Text.assemble(
        ("● ", STATUS_STYLE.get(status, "white")),
        (state.run_id, "bold"),
        "  ",
        (status, STATUS_STYLE.get(status, "white")),
        ("  ", ""),
        (
            f"{agent.get('kind', '')} · {model_name(agent)} · round {rnd} · "
            f"{usage.get('input_tokens', 0)}→{usage.get('output_tokens', 0)} tok · "
            f"${usage.get('cost', 0):.6f} · {_wall_seconds(run):.1f} s",
            "dim",
        ),
    )


def _committed(state: LiveRun, view: RoundView) -> bool:
    """A round whose model reply is stored and that the run moved past (a later round, a
    pause or the end): its reasoning and text will not change any more."""
    if view.streaming or view.usage is None:
        return False
    return view.n < state.current_round or state.status not in ("queued", "running")


class RunPanel:
    """The terminal view as an append-only log plus a live region. ``flush`` prints, once,
    the question, each committed round, and each tool line once the tool is done; the live
    region (this renderable) holds the rest: a streaming round, running or waiting tools, the
    plan, the pause and a status bar. Renders under ``lock``, which the watcher holds while
    it changes the state."""

    def __init__(self, state: LiveRun, console: Console) -> None:
        self.state, self.console = state, console
        self.lock = threading.RLock()
        self.printed, self.printed_tools = state.printed, state.printed_tools

    def flush(self) -> None:
        # build under the lock, print outside it: printing waits for the Live refresh thread,
        # which waits for this lock to render the live region (lock order)
        for renderable in self._newly_printable():
            self.console.print(renderable)

    def _newly_printable(self) -> list[RenderableType]:
        out: list[RenderableType] = []
        with self.lock:
            if not self.printed and self.state.question():
                out.append(Text.assemble(("› ", "bold cyan"), (self.state.question(), "bold")))
                self.printed.add(0)
            now = time.time()
            for view in self.state.rounds():
                done = [
                    t
                    for t in view.tools
                    if t.status == "done" and t.call_id not in self.printed_tools
                ]
                if view.n in self.printed:
                    out.extend(_tool_line(t, now) for t in done)
                elif _committed(self.state, view):
                    out.append(Group(*_round(view, now, done)))
                    self.printed.add(view.n)
                else:
                    continue
                self.printed_tools.update(t.call_id for t in done)
        return out

    def tail(self, *, pending: bool = True) -> RenderableType:
        with self.lock:
            return self._render(pending=pending)

    def _render(self, *, pending: bool = True) -> RenderableType:
        state, parts, now = self.state, [], time.time()
        for view in state.rounds():
            if view.n not in self.printed:
                parts.extend(_round(view, now))
            else:
                parts.extend(
                    _tool_line(t, now) for t in view.tools if t.call_id not in self.printed_tools
                )
        if state.run.get("plan"):
            parts.append(plan_view(state.run["plan"]))
        if pending and state.pending:
            parts.append(pending_view(state.pending))
        if state.status == "failed" and state.run.get("error"):
            err = state.run["error"]
            parts.append(
                Panel(
                    escape(str(err.get("message"))),
                    title=f"failed: {err.get('code')}",
                    border_style="red",
                )
            )
        parts.append(_status_bar(state))
        return Group(*parts)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        with self.lock:
            region = self._render()
        yield region


def _sync(client: ApiClient, panel: RunPanel) -> None:
    state = panel.state
    rid = state.run_id
    snapshot = (client.run(rid), client.messages(rid), client.tool_calls(rid), client.usage(rid))
    with panel.lock:
        state.sync(*snapshot)
    panel.flush()


def _is_current_pause(ev: Event, state: LiveRun) -> bool:
    return state.status == "waiting" and pause_id(ev.data.get("pending")) == pause_id(
        state.run.get("pending")
    )


def _pump(client: ApiClient, panel: RunPanel) -> None:
    """Apply events until the run ends or pauses on its current pause. The stored state is
    fetched again after events that change it, at most every ``_MIN_SYNC_S`` (a skipped fetch
    is made at the next event after that) and always at a pause or the end."""
    state, last_sync, dirty = panel.state, 0.0, False
    for ev in client.events(state.run_id, after=state.cursor):
        with panel.lock:
            dirty = state.apply(ev) or dirty
        final = ev.type in TERMINAL
        if (
            final
            or ev.type == EventType.RUN_WAITING
            or (dirty and time.monotonic() - last_sync > _MIN_SYNC_S)
        ):
            _sync(client, panel)
            last_sync, dirty = time.monotonic(), False
        if final or (ev.type == EventType.RUN_WAITING and _is_current_pause(ev, state)):
            return


@contextmanager
def _live(console: Console, panel: RunPanel, live: bool) -> Iterator[None]:
    if not live:
        yield
        return
    with Live(panel, console=console, refresh_per_second=8, transient=True):
        yield


def follow(
    client: ApiClient,
    state: LiveRun,
    console: Console,
    *,
    live: bool = True,
    show_pending: bool = True,
) -> LiveRun:
    """Show the run until it ends or waits. ``state`` keeps the cursor and what was printed
    for the next call (after a pause is answered)."""
    panel = RunPanel(state, console)
    with _live(console, panel, live and console.is_terminal):
        _sync(client, panel)
        if state.status not in ("completed", "failed", "cancelled", "waiting"):
            _pump(client, panel)
    panel.flush()
    console.print(panel.tail(pending=show_pending))
    return state
