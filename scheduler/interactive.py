"""Answering a paused run from a terminal, and watching a run through its pauses.

``watch_run`` follows a run live; when it waits on a question or an approval and a person is
at the terminal (``interactive``), it asks them (``scheduler.prompts``), sends the answer over
the API and follows on until the run ends.
"""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.text import Text

from scheduler.client import ApiClient
from scheduler.livestate import LiveRun
from scheduler.prompts import Choice, checklist, choose
from scheduler.watch import follow

__all__ = ["OTHER", "approval_choices", "ask_answers", "decide_approval", "resolve_pause",
           "watch_run"]

OTHER = "Something else (type it)"


def ask_answers(console: Console, pending: dict[str, Any]) -> list[str]:
    """One answer per question of an ask: a picked option's value, or typed text."""
    if pending.get("reason"):
        console.print(Text.assemble(("? ", "bold magenta"), (pending["reason"], "italic")))
    answers = []
    for q in pending.get("questions") or []:
        choices = [Choice(o["label"], o["value"]) for o in q.get("options") or []]
        answers.append(choose(console, q["question"], choices, other=OTHER))
    return answers


def _args_text(arguments: Any, width: int = 100) -> str:
    text = json.dumps(arguments, ensure_ascii=False) if not isinstance(arguments, str) else \
        arguments
    return text if len(text) <= width else text[: width - 1] + "…"


def approval_choices(pending: dict[str, Any]) -> list[Choice]:
    """The approval's writes as checklist rows: tool, call id, argument preview."""
    return [Choice(str(item.get("tool")), item["call_id"],
                   f"({item['call_id']})  {_args_text(item.get('arguments') or {})}",
                   json.dumps(item.get("arguments") or {}, indent=2, ensure_ascii=False))
            for item in pending.get("items") or []]


def decide_approval(console: Console, pending: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(approved call ids, rejected call ids), from a checklist where ticked = approve."""
    choices = approval_choices(pending)
    marks = checklist(console, "Approve these writes? (ticked = approve)", choices)
    approved = [c.value for c, keep in zip(choices, marks, strict=True) if keep]
    rejected = [c.value for c, keep in zip(choices, marks, strict=True) if not keep]
    summary = f"approving {len(approved)}, rejecting {len(rejected)}"
    console.print(Text(summary, style="green" if not rejected else "yellow"))
    return approved, rejected


def resolve_pause(client: ApiClient, run: dict[str, Any], console: Console) -> dict[str, Any]:
    """Ask the person at the terminal about the run's pause and send their decision."""
    pending = run.get("pending") or {}
    if pending.get("kind") == "ask":
        return client.answer(run["id"], pending["ask_id"], ask_answers(console, pending))
    approved, rejected = decide_approval(console, pending)
    return client.approve(run["id"], pending["approval_id"], approved, rejected)


def watch_run(client: ApiClient, run_id: str, console: Console, *,
              interactive: bool) -> dict[str, Any]:
    """Follow the run to its end; pauses are answered here when ``interactive``, else the
    run is returned while it waits."""
    state = LiveRun(run_id)
    while True:
        follow(client, state, console, show_pending=not interactive)
        if state.status != "waiting" or not interactive:
            return state.run
        resolve_pause(client, state.run, console)
