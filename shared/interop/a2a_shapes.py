"""A2A shapes of treadle runs (docs/a2a.md), as A2A 1.0 JSON (what ``a2a-sdk`` parses into
its protobuf types): a task is a run, its context the run's thread, ``input-required`` a
pause (an ask or an approval), the result an artifact. Also the push notification body: an A2A
run's webhook (``render: "a2a"``) sends ``{"task": ...}`` at each pause and at the end,
signed like every treadle webhook (Standard Webhooks).

| treadle run | A2A task state |
|---|---|
| scheduled, queued | ``TASK_STATE_SUBMITTED`` |
| running | ``TASK_STATE_WORKING`` |
| waiting (ask, approval) | ``TASK_STATE_INPUT_REQUIRED`` |
| completed / failed / cancelled | ``TASK_STATE_COMPLETED`` / ``_FAILED`` / ``_CANCELED`` |
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy.engine import Connection

from shared.interop.thread_ids import public_id
from shared.isotime import iso, iso_times

__all__ = [
    "A2A",
    "STATES",
    "a2a_body",
    "context_of",
    "pause_text",
    "task_json",
]

A2A = "a2a"  # the renderer's name (a run's webhook ``render``)
STATES = {
    "scheduled": "TASK_STATE_SUBMITTED",
    "queued": "TASK_STATE_SUBMITTED",
    "running": "TASK_STATE_WORKING",
    "waiting": "TASK_STATE_INPUT_REQUIRED",
    "completed": "TASK_STATE_COMPLETED",
    "failed": "TASK_STATE_FAILED",
    "cancelled": "TASK_STATE_CANCELED",
}
Row = Mapping[str, Any]


def context_of(run: Row) -> str:
    """A task's context: its run's thread (as the client named it), else the run itself."""
    thread = run.get("thread_id")
    return public_id(str(thread)) if thread else str(run["id"])


def pause_text(pending: Mapping[str, Any]) -> str:
    """What a paused run asks, as text: the ask's reason and questions (with their options),
    or the writes that await approval and how to answer."""
    if pending.get("kind") == "ask":
        lines = [str(pending.get("reason") or "The agent has a question.")]
        for q in pending.get("questions") or []:
            options = ", ".join(f"{o['label']} ({o['value']})" for o in q.get("options") or [])
            lines.append(f"- {q.get('question')}" + (f" Options: {options}" if options else ""))
        lines.append("Answer with one text part per question.")
        return "\n".join(lines)
    items = [f"- {i.get('preview') or i.get('tool')}" for i in pending.get("items") or []]
    return "\n".join(
        [
            "The agent proposes writes that need approval:",
            *items,
            'Answer "approve" or "reject" (or a data part {"approve": [call ids], "note"}).',
        ]
    )


def _message(run: Row, context: str, key: str, parts: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "messageId": f"{run['id']}:{key}",
        "role": "ROLE_AGENT",
        "taskId": run["id"],
        "contextId": context,
        "parts": parts,
    }


def _status(run: Row, context: str) -> dict[str, Any]:
    status: dict[str, Any] = {
        "state": STATES.get(str(run["status"]), "TASK_STATE_WORKING"),
        "timestamp": iso(float(run["updated_at"])),
    }
    pending = run.get("pending") or {}
    if run["status"] == "waiting" and pending:
        pause = pending.get("ask_id") or pending.get("approval_id") or "pause"
        parts: list[dict[str, Any]] = [
            {"text": pause_text(pending)},
            {"data": {"pause": iso_times(dict(pending))}},
        ]
        status["message"] = _message(run, context, f"pause:{pause}", parts)
    elif run["status"] == "failed":
        error = run.get("error") or {}
        text = str(error.get("message") or "the run failed")
        status["message"] = _message(run, context, "error", [{"text": text}])
    return status


def _artifacts(run: Row) -> list[dict[str, Any]]:
    if run["status"] != "completed":
        return []
    result = dict(run.get("result") or {})
    parts: list[dict[str, Any]] = [{"text": str(result.get("text") or "")}]
    if isinstance(result.get("data"), dict):
        parts.append({"data": result["data"]})
    return [{"artifactId": "result", "name": "result", "parts": parts}]


def task_json(run: Row) -> dict[str, Any]:
    """The run as an A2A task (``run``: a runs row, or a run view's fields)."""
    context = context_of(run)
    task: dict[str, Any] = {
        "id": run["id"],
        "contextId": context,
        "status": _status(run, context),
        "metadata": {"treadle": {"run_id": run["id"], "status": str(run["status"])}},
    }
    artifacts = _artifacts(run)
    if artifacts:
        task["artifacts"] = artifacts
    return task


def a2a_body(
    conn: Connection, run: Row, event: tuple[int, str, Mapping[str, Any]], doc: dict[str, Any]
) -> dict[str, Any] | None:
    """The push notification of an A2A task: ``{"task": ...}`` (a StreamResponse)."""
    return {"task": task_json({**run, "status": str(run["status"])})}
