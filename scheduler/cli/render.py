"""Printing a run and its transcript in a terminal (rich)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.text import Text

__all__ = ["pending_view", "plan_view", "print_run", "print_transcript", "print_warnings"]

_PLAN_MARK = {
    "done": ("✔", "green"),
    "in_progress": ("▶", "cyan"),
    "blocked": ("✖", "red"),
    "skipped": ("–", "dim"),
    "pending": ("○", "dim"),
}

_STYLE = {"completed": "green", "failed": "red", "cancelled": "yellow", "waiting": "magenta"}


def print_run(console: Console, run: Mapping[str, Any]) -> None:
    status = run["status"]
    usage = run.get("usage") or {}
    line = Text.assemble(
        ("run ", "bold"),
        (run["id"], "cyan"),
        "  ",
        (status, _STYLE.get(status, "blue")),
        f"  stop={run.get('stop_reason')}  round={run.get('round')}  "
        f"tokens={usage.get('input_tokens', 0)}/{usage.get('output_tokens', 0)}  "
        f"cost={usage.get('cost', 0):.6f}",
    )
    console.print(line)
    print_warnings(console, run)
    if run.get("plan"):
        console.print(plan_view(run["plan"]))
    if run.get("pending"):
        console.print(pending_view(run["pending"]))
    if run.get("error"):
        console.print(Panel(str(run["error"].get("message")), title="error", border_style="red"))


def print_warnings(console: Console, run: Mapping[str, Any]) -> None:
    """What was dropped from the run's spec (SPEC P-5), one yellow line each."""
    for warning in run.get("warnings") or ():
        console.print(Text.assemble(("warning: ", "bold yellow"), (str(warning), "yellow")))


def plan_view(plan: Mapping[str, Any]) -> RenderableType:
    """The plan as a checklist: one line per step, its status mark and note."""
    lines = [Text(f"plan: {plan.get('name', '')}", style="bold")]
    for step in plan.get("steps") or []:
        mark, style = _PLAN_MARK.get(step.get("status"), ("○", "dim"))
        line = Text.assemble((f" {mark} ", style), (step.get("name", ""), ""))
        if step.get("note"):
            line.append(f"  — {step['note']}", style="dim")
        lines.append(line)
    return Group(*lines)


def pending_view(pending: Mapping[str, Any]) -> RenderableType:
    """A pause as people read it: the questions and their options, or the proposed writes."""
    if pending.get("kind") == "ask":
        body = [Text(pending.get("reason") or "", style="italic")]
        for q in pending.get("questions") or []:
            opts = " · ".join(o.get("label", "") for o in q.get("options") or [])
            body += [Text(q.get("question", ""), style="bold"), Text(f"  {opts}", style="dim")]
        return Panel(Group(*body), title="waiting: question", border_style="magenta")
    items = [
        Text.assemble(("• ", "magenta"), (i.get("preview") or i.get("tool", ""), ""))
        for i in pending.get("items") or []
    ]
    return Panel(Group(*items), title="waiting: approval", border_style="magenta")


def _content(m: Mapping[str, Any]) -> str:
    c = m.get("content")
    if isinstance(c, list):
        return " ".join(str(p.get("text", f"[{p.get('type')}]")) for p in c)
    return str(c or "")


def print_transcript(console: Console, messages: Sequence[Mapping[str, Any]]) -> None:
    for m in messages:
        role = m["role"]
        if m.get("reasoning"):
            console.print(Text(f"  (thinking) {m['reasoning']}", style="dim italic"))
        text = _content(m)
        if role == "tool":
            console.print(
                Text.assemble(("  ⚙ ", "yellow"), (f"{m.get('name')} → ", "yellow"), text[:400])
            )
            continue
        if text:
            style = {"user": "bold", "assistant": "green", "system": "dim"}.get(role, "")
            console.print(Text.assemble((f"{role}: ", style), text))
        for c in m.get("tool_calls") or []:
            console.print(
                Text.assemble(("  → call ", "cyan"), (c["name"], "bold cyan"), f" {c['arguments']}")
            )
