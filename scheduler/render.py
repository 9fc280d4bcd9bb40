"""Printing a run and its transcript in a terminal (rich)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.text import Text

__all__ = ["print_run", "print_transcript"]

_STYLE = {"completed": "green", "failed": "red", "cancelled": "yellow", "waiting": "magenta"}


def print_run(console: Console, run: Mapping[str, Any]) -> None:
    status = run["status"]
    usage = run.get("usage") or {}
    line = Text.assemble(
        ("run ", "bold"), (run["id"], "cyan"), "  ", (status, _STYLE.get(status, "blue")),
        f"  stop={run.get('stop_reason')}  round={run.get('round')}  "
        f"tokens={usage.get('input_tokens', 0)}/{usage.get('output_tokens', 0)}  "
        f"cost={usage.get('cost', 0):.6f}",
    )
    console.print(line)
    if run.get("pending"):
        console.print(Panel(json.dumps(run["pending"], indent=2, ensure_ascii=False),
                            title="pending", border_style="magenta"))
    if run.get("error"):
        console.print(Panel(str(run["error"].get("message")), title="error", border_style="red"))


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
            console.print(Text.assemble(("  ⚙ ", "yellow"), (f"{m.get('name')} → ", "yellow"),
                                        text[:400]))
            continue
        if text:
            style = {"user": "bold", "assistant": "green", "system": "dim"}.get(role, "")
            console.print(Text.assemble((f"{role}: ", style), text))
        for c in m.get("tool_calls") or []:
            console.print(Text.assemble(("  → call ", "cyan"), (c["name"], "bold cyan"),
                                        f" {c['arguments']}"))
