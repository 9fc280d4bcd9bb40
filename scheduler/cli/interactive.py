"""Answering a paused run from a terminal, and watching a run through its pauses.

``watch_run`` follows a run live; when it waits on a question or an approval and a person is
at the terminal (``interactive``), it asks them (``scheduler.cli.prompts``), sends the answer over
the API and follows on until the run ends.
"""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.text import Text

from scheduler.cli.client import ApiClient
from scheduler.cli.livestate import LiveRun
from scheduler.cli.prompts import Choice, checklist, choose, free_text
from scheduler.cli.watch import follow

__all__ = [
    "OTHER",
    "approval_choices",
    "ask_answers",
    "decide_approval",
    "resolve_pause",
    "watch_run",
]

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
    text = (
        json.dumps(arguments, ensure_ascii=False) if not isinstance(arguments, str) else arguments
    )
    return text if len(text) <= width else text[: width - 1] + "…"


def approval_choices(pending: dict[str, Any]) -> list[Choice]:
    """The approval's writes as checklist rows: tool, call id, argument preview."""
    return [
        Choice(
            str(item.get("tool")),
            item["call_id"],
            f"({item['call_id']})  {_args_text(item.get('arguments') or {})}",
            json.dumps(item.get("arguments") or {}, indent=2, ensure_ascii=False),
        )
        for item in pending.get("items") or []
    ]


def decide_approval(console: Console, pending: dict[str, Any]) -> list[dict[str, Any]]:
    """Per-item decisions from a checklist where ticked = approve; each rejected write may get
    a message the model reads (``Declined by user: <message>``; enter skips it)."""
    choices = approval_choices(pending)
    marks = checklist(console, "Approve these writes? (ticked = approve)", choices)
    decided: list[dict[str, Any]] = []
    for choice, keep in zip(choices, marks, strict=True):
        if keep:
            decided.append({"call_id": choice.value, "action": "approve"})
            continue
        why = free_text(
            console, f"Why not {choice.label} ({choice.value})? (optional, enter skips)"
        )
        decision: dict[str, Any] = {"call_id": choice.value, "action": "reject"}
        if why:
            decision["message"] = why
        decided.append(decision)
    rejected = sum(1 for d in decided if d["action"] == "reject")
    summary = f"approving {len(decided) - rejected}, rejecting {rejected}"
    console.print(Text(summary, style="green" if not rejected else "yellow"))
    return decided


def resolve_pause(client: ApiClient, run: dict[str, Any], console: Console) -> dict[str, Any]:
    """Ask the person at the terminal about the run's pause and send their decision."""
    pending = run.get("pending") or {}
    if pending.get("kind") == "ask":
        return client.answer(run["id"], pending["ask_id"], ask_answers(console, pending))
    return client.decide(run["id"], pending["approval_id"], decide_approval(console, pending))


def watch_run(
    client: ApiClient, run_id: str, console: Console, *, interactive: bool
) -> dict[str, Any]:
    """Follow the run to its end; pauses are answered here when ``interactive``, else the
    run is returned while it waits."""
    state = LiveRun(run_id)
    while True:
        follow(client, state, console, show_pending=not interactive)
        kind = (state.pending or {}).get("kind")
        if state.status != "waiting" or not interactive or kind not in ("ask", "approval"):
            return state.run  # a wait for the model provider ends by itself
        resolve_pause(client, state.run, console)
