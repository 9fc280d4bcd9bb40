"""The transcript rule a strict provider enforces, as OpenAI does, for the model doubles.

An assistant message with ``tool_calls`` must be followed, before any other message, by one
``tool`` message per call id; a ``tool`` message must answer a call of the assistant message
just before its block. OpenAI answers a request that breaks either rule with HTTP 400. The
fake server and the offline models check every request with ``transcript_problem`` so that a
run which would fail against a real provider fails in the tests too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "DANGLING_PREFIX",
    "ORPHAN_TOOL_MESSAGE",
    "error_body",
    "transcript_problem",
]

DANGLING_PREFIX = (
    "An assistant message with 'tool_calls' must be followed by tool messages responding to "
    "each 'tool_call_id'. The following tool_call_ids did not have response messages: "
)
ORPHAN_TOOL_MESSAGE = (
    "Invalid parameter: messages with role 'tool' must be a response to a preceeding message "
    "with 'tool_calls'."
)


def _call_ids(message: Mapping[str, Any]) -> list[str]:
    return [str(c.get("id")) for c in message.get("tool_calls") or () if isinstance(c, Mapping)]


def transcript_problem(messages: Sequence[Mapping[str, Any]]) -> tuple[int, str] | None:
    """``(index, message)`` of the first wire message breaking the rule, else None.

    ``messages`` are wire dicts (``role``, ``tool_calls``, ``tool_call_id``). The index is the
    message that found the problem: the first message after an unanswered call (or the
    length of the list, when the request ends with one), or the orphan tool message."""
    open_ids: list[str] = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            continue
        if message.get("role") == "tool":
            call_id = str(message.get("tool_call_id"))
            if call_id not in open_ids:
                return i, ORPHAN_TOOL_MESSAGE
            open_ids.remove(call_id)
            continue
        if open_ids:
            return i, DANGLING_PREFIX + ", ".join(open_ids)
        open_ids = _call_ids(message) if message.get("role") == "assistant" else []
    if open_ids:
        return len(messages), DANGLING_PREFIX + ", ".join(open_ids)
    return None


def error_body(index: int, message: str) -> dict[str, Any]:
    """The OpenAI error body of a 400 for ``transcript_problem``'s answer."""
    return {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": f"messages.[{index}].role",
            "code": None,
        }
    }
