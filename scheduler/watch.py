"""``treadle watch``: a run followed live over SSE in a terminal (rich Live).

Reasoning is dimmed, answer text streams as it arrives, tools are cards with a spinner while
they run and their timing after, the plan is a checklist, tokens and cost tick with every
commit. ``follow`` stops at a pause (``waiting``) or at the end; in a terminal the caller
answers the pause and follows on (``scheduler.interactive``).
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

from scheduler.client import TERMINAL, ApiClient, Event
from scheduler.livestate import LiveRun, RoundView, ToolCard, pause_id

__all__ = ["STATUS_STYLE", "RunPanel", "follow"]

STATUS_STYLE = {"completed": "green", "failed": "red", "cancelled": "yellow",
                "waiting": "magenta", "running": "cyan", "queued": "blue"}
_PLAN_MARK = {"done": ("✔", "green"), "in_progress": ("▶", "cyan"), "blocked": ("✖", "red"),
              "skipped": ("–", "dim"), "pending": ("○", "dim")}
_MIN_SYNC_S = 0.2


def _args_preview(arguments: str, width: int = 90) -> str:
    try:
        parsed = json.loads(arguments or "{}")
        text = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in parsed.items())
    except (ValueError, AttributeError):
        text = arguments
    return text if len(text) <= width else text[: width - 1] + "…"


def _seconds(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.1f} s"


def _tool_line(card: ToolCard, now: float) -> RenderableType:
    head = Text.assemble((card.name, "bold"), ("(", "dim"), (_args_preview(card.arguments), ""),
                         (")", "dim"))
    timing = Text(_seconds(card.seconds(now)), style="dim")
    if card.status == "running":
        mark: RenderableType = Spinner("dots", style="cyan")
    elif card.status == "waiting":
        mark = Text("⏸", style="magenta")
    elif card.status == "queued":
        mark = Text("…", style="dim")
    else:
        mark = Text("✖" if card.error else "✔", style="red" if card.error else "green")
    grid = Table.grid(padding=(0, 1), expand=True)
    grid.add_column(width=2)
    grid.add_column(ratio=1)
    grid.add_column(justify="right", no_wrap=True)
    grid.add_row(mark, head, timing)
    result = card.error or card.preview
    if card.status == "done" and result:
        grid.add_row("", Text("→ " + result.replace("\n", " ")[:200],
                              style="red" if card.error else "dim"), "")
    return grid


def _round_header(view: RoundView) -> Text:
    line = Text(f"round {view.n}", style="bold blue")
    u = view.usage
    if u:
        line.append(f"  {u['input_tokens']}→{u['output_tokens']} tok  ${u['cost']:.6f}"
                    f"  {_seconds((u.get('latency_ms') or 0) / 1000)}", style="dim")
    elif view.streaming:
        line.append("  streaming…", style="dim cyan")
    return line


def _round(view: RoundView, now: float) -> list[RenderableType]:
    out: list[RenderableType] = [_round_header(view)]
    if view.reasoning:
        out.append(Text(view.reasoning.strip(), style="dim italic"))
    if view.text:
        out.append(Text(view.text.strip() + (" ▌" if view.streaming else "")))
    elif view.streaming or (not view.tools and view.usage is None):
        out.append(Spinner("dots", text=Text("thinking", style="dim"), style="cyan"))
    out.extend(_tool_line(card, now) for card in view.tools)
    return out


def _plan(plan: dict[str, Any]) -> RenderableType:
    lines = [Text(f"plan: {plan.get('name', '')}", style="bold")]
    for step in plan.get("steps") or []:
        mark, style = _PLAN_MARK.get(step.get("status"), ("○", "dim"))
        line = Text.assemble((f" {mark} ", style), (step.get("name", ""), ""))
        if step.get("note"):
            line.append(f"  — {step['note']}", style="dim")
        lines.append(line)
    return Group(*lines)


def _pending(pending: dict[str, Any]) -> RenderableType:
    if pending.get("kind") == "ask":
        body = [Text(pending.get("reason") or "", style="italic")]
        for q in pending.get("questions") or []:
            opts = " · ".join(o.get("label", "") for o in q.get("options") or [])
            body += [Text(q.get("question", ""), style="bold"), Text(f"  {opts}", style="dim")]
        return Panel(Group(*body), title="waiting: question", border_style="magenta")
    items = [Text.assemble(("• ", "magenta"), (i.get("preview") or i.get("tool", ""), ""))
             for i in pending.get("items") or []]
    return Panel(Group(*items), title="waiting: approval", border_style="magenta")


def _status_bar(state: LiveRun, elapsed: float) -> Text:
    run, status = state.run, state.status
    usage = run.get("usage") or {}
    agent = run.get("agent") or {}
    model = agent.get("model")
    model_name = model if isinstance(model, str) else (model or {}).get("name") or "inline"
    return Text.assemble(
        ("● ", STATUS_STYLE.get(status, "white")), (state.run_id, "bold"), "  ",
        (status, STATUS_STYLE.get(status, "white")), ("  ", ""),
        (f"{agent.get('kind', '')} · {model_name} · round {run.get('round', 0)} · "
         f"{usage.get('input_tokens', 0)}→{usage.get('output_tokens', 0)} tok · "
         f"${usage.get('cost', 0):.6f} · {elapsed:.1f} s", "dim"),
    )


def _settled(state: LiveRun, view: RoundView) -> bool:
    """A round that will not change any more: committed, its tools done, and the run moved
    on (a later round, a pause or the end)."""
    if view.streaming or view.usage is None or any(t.status != "done" for t in view.tools):
        return False
    return view.n < state.current_round or state.status not in ("queued", "running")


class RunPanel:
    """The live region: unsettled rounds, plan, pending pause, a status bar. Settled rounds
    are printed once above it (``flush``). Renders under ``lock``, which the watcher holds
    while it changes the state."""

    def __init__(self, state: LiveRun, console: Console) -> None:
        self.state, self.console = state, console
        self.lock, self.t0 = threading.RLock(), time.monotonic()
        self.printed = state.printed

    def flush(self) -> None:
        """Print the question (once) and every newly settled round above the live region."""
        with self.lock:
            if not self.printed and self.state.question():
                self.console.print(Text.assemble(("› ", "bold cyan"),
                                                 (self.state.question(), "bold")))
                self.printed.add(0)
            for view in self.state.rounds():
                if view.n not in self.printed and _settled(self.state, view):
                    self.console.print(Group(*_round(view, time.time())))
                    self.printed.add(view.n)

    def tail(self, *, pending: bool = True) -> RenderableType:
        with self.lock:
            return self._render(rounds=False, pending=pending)

    def _render(self, *, rounds: bool = True, pending: bool = True) -> RenderableType:
        state, parts = self.state, []
        if rounds:
            for view in state.rounds():
                if view.n not in self.printed:
                    parts.extend(_round(view, time.time()))
        if state.run.get("plan"):
            parts.append(_plan(state.run["plan"]))
        if pending and state.pending:
            parts.append(_pending(state.pending))
        if state.status == "failed" and state.run.get("error"):
            err = state.run["error"]
            parts.append(Panel(escape(str(err.get("message"))),
                               title=f"failed: {err.get('code')}", border_style="red"))
        parts.append(_status_bar(state, time.monotonic() - self.t0))
        return Group(*parts)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        with self.lock:
            yield self._render()


def _sync(client: ApiClient, panel: RunPanel) -> None:
    state = panel.state
    rid = state.run_id
    snapshot = (client.run(rid), client.messages(rid), client.tool_calls(rid), client.usage(rid))
    with panel.lock:
        state.sync(*snapshot)
    panel.flush()


def _is_current_pause(ev: Event, state: LiveRun) -> bool:
    return state.status == "waiting" and \
        pause_id(ev.data.get("pending")) == pause_id(state.run.get("pending"))


def _pump(client: ApiClient, panel: RunPanel) -> None:
    """Apply events until the run ends or pauses on its current pause."""
    state, last_sync = panel.state, 0.0
    for ev in client.events(state.run_id, after=state.cursor):
        with panel.lock:
            wants = state.apply(ev)
        important = ev.type == "run.waiting" or ev.type in TERMINAL
        if important or (wants and time.monotonic() - last_sync > _MIN_SYNC_S):
            _sync(client, panel)
            last_sync = time.monotonic()
        if ev.type in TERMINAL or (ev.type == "run.waiting" and _is_current_pause(ev, state)):
            return


@contextmanager
def _live(console: Console, panel: RunPanel, live: bool) -> Iterator[None]:
    if not live:
        yield
        return
    with Live(panel, console=console, refresh_per_second=8, transient=True):
        yield


def follow(client: ApiClient, state: LiveRun, console: Console, *, live: bool = True,
           show_pending: bool = True) -> LiveRun:
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
