"""Keeping the model's context small (SPEC L-7, L-8).

L-7: a tool result over its budget is reduced before it enters the model view (JSON minified
or summarized structurally, long ids and base64 elided, then a 60/40 head/tail cut with an
explicit marker). Storage keeps the full result; only the model view is reduced.

L-8: when the run's own messages pass 80% of the window, one model call summarizes
everything after the system prompt into a ``<context_checkpoint>`` user message (the active
plan as JSON in front). Later rounds send system + checkpoint + what came after
(``model_view``). Nothing is deleted: the checkpoint is a message row marking where the
model view starts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from shared.agent.messages import Message
from shared.agent.plan import Plan, plan_json
from shared.agent.tokens import estimate_messages_tokens, estimate_tokens, is_cjk

__all__ = [
    "CHECKPOINT_KIND",
    "CHECKPOINT_SYSTEM_PROMPT",
    "CHECKPOINT_THRESHOLD",
    "HEAD_SHARE",
    "MIN_TOOL_RESULT_TOKENS",
    "checkpoint_message",
    "checkpoint_request_messages",
    "clean_checkpoint_summary",
    "compression_due",
    "compression_retry_at",
    "elide_ids",
    "is_checkpoint",
    "model_view",
    "needs_checkpoint",
    "reduce_tool_result",
    "tool_result_budget",
    "truncate_middle",
]

CHECKPOINT_KIND = "context_checkpoint"
CHECKPOINT_THRESHOLD = 0.8
# after a failed compression, the next one waits until the run's messages have grown by this
# share of the window: a compression that fails the same way every round would bill a model
# call every round
RETRY_GROWTH = 0.1
TOOL_RESULT_SHARE = 0.2
MIN_TOOL_RESULT_TOKENS = 4096
HEAD_SHARE = 0.6

_DATA_URL = re.compile(r"data:[\w/+.-]+;base64,[A-Za-z0-9+/]+=*")
_BASE64 = re.compile(r"(?<![A-Za-z0-9+/])[A-Za-z0-9+/]{100,}={0,2}")
_LONG_HEX = re.compile(r"(?<![0-9A-Za-z])[0-9a-fA-F]{40,}(?![0-9A-Za-z])")
_INNER_SPACES = re.compile(r"(?<=\S)[ \t]{2,}")
_BLANK_LINES = re.compile(r"\n{3,}")
_FENCE = re.compile(r"^```[\w-]*\s*\n?|\n?```\s*$")
_CHECKPOINT_OPEN = "<context_checkpoint>"
_CHECKPOINT_CLOSE = "</context_checkpoint>"

# (items kept per list, characters kept per string, depth) from generous to terse
_SUMMARY_LADDER = ((50, 1000, 8), (20, 400, 6), (10, 200, 5), (5, 100, 4), (3, 60, 3), (1, 40, 2))


# --- L-7: tool results ------------------------------------------------------------------


def tool_result_budget(context_window: int, override: int | None = None) -> int:
    """SPEC L-7: ``tool_result_max_tokens`` if set, else 20% of the window, at least 4096.

    The default never exceeds the window itself (a window under 4096 tokens caps it).
    """
    if override is not None:
        return max(1, override)
    default = max(MIN_TOOL_RESULT_TOKENS, int(context_window * TOOL_RESULT_SHARE))
    return min(context_window, default) if context_window > 0 else default


def reduce_tool_result(text: str, max_tokens: int) -> str:
    """SPEC L-7: ``text`` if it fits ``max_tokens``, else a reduced form that does.

    JSON is minified, then (still too big) its long ids/base64 are elided, then it is
    summarized structurally (lists cut 60/40 with a count, long strings cut); plain text has
    long ids/base64 elided and runs of whitespace collapsed. Whatever still does not fit is
    cut head/tail 60/40 around ``[... truncated N tokens ...]``.
    """
    if estimate_tokens(text) <= max_tokens:
        return text
    reduced = _reduce_json(text, max_tokens)
    if reduced is None:
        reduced = _clean_text(text)
    if estimate_tokens(reduced) <= max_tokens:
        return reduced
    return truncate_middle(reduced, max_tokens)


def elide_ids(text: str) -> str:
    """Replace base64 blobs (and data URLs) and long hex ids (40+ digits) with short stubs.

    A hex id keeps its first 12 digits (still usable as a prefix); UUIDs are left alone.
    """
    text = _DATA_URL.sub(lambda m: f"[base64 data, {len(m.group(0))} chars]", text)
    text = _BASE64.sub(lambda m: f"[base64, {len(m.group(0))} chars]", text)
    return _LONG_HEX.sub(lambda m: f"{m.group(0)[:12]}…", text)


def truncate_middle(text: str, max_tokens: int, head_share: float = HEAD_SHARE) -> str:
    """Keep the head (60%) and the tail (40%) of the budget around an explicit marker."""
    total = estimate_tokens(text)
    if total <= max_tokens:
        return text
    reserve = estimate_tokens(_marker(total)) + 2
    available = max(0, max_tokens - reserve)
    head_budget = int(available * head_share)
    tail_budget = available - head_budget
    head = _snap_head(text[: _prefix_len(text, head_budget)])
    tail_start = len(text) - _suffix_len(text, tail_budget)
    tail = _snap_tail(text[max(tail_start, len(head)) :])
    omitted = max(0, total - estimate_tokens(head) - estimate_tokens(tail))
    return f"{head}\n{_marker(omitted)}\n{tail}"


def _marker(tokens: int) -> str:
    return f"[... truncated {tokens} tokens ...]"


def _clean_text(text: str) -> str:
    text = elide_ids(text)
    lines = [_INNER_SPACES.sub(" ", line.rstrip()) for line in text.split("\n")]
    return _BLANK_LINES.sub("\n\n", "\n".join(lines)).strip()


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _reduce_json(text: str, max_tokens: int) -> str | None:
    stripped = text.strip()
    if not stripped or stripped[0] not in "[{":
        return None
    try:
        value = json.loads(stripped)
    except ValueError:
        return None
    minified = _dumps(value)
    if estimate_tokens(minified) <= max_tokens:
        return minified
    value = _map_strings(value, elide_ids)
    elided = _dumps(value)
    if estimate_tokens(elided) <= max_tokens:
        return elided
    summary = elided
    for items, chars, depth in _SUMMARY_LADDER:
        summary = _dumps(_summarize(value, items, chars, depth))
        if estimate_tokens(summary) <= max_tokens:
            return summary
    return summary


def _map_strings(value: Any, fn: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, list):
        return [_map_strings(v, fn) for v in value]
    if isinstance(value, dict):
        return {k: _map_strings(v, fn) for k, v in value.items()}
    return value


def _summarize(value: Any, items: int, chars: int, depth: int) -> Any:
    """A smaller value of the same shape: lists keep head/tail items, strings their head."""
    if isinstance(value, str):
        if len(value) <= chars:
            return value
        return f"{value[:chars]}…[+{len(value) - chars} chars]"
    if isinstance(value, list):
        if depth <= 0:
            return f"[array of {len(value)} items]" if value else []
        if len(value) <= items:
            return [_summarize(v, items, chars, depth - 1) for v in value]
        head = max(1, round(items * HEAD_SHARE))
        tail = max(0, items - head)
        kept = [_summarize(v, items, chars, depth - 1) for v in value[:head]]
        kept.append(f"[... {len(value) - head - tail} more items ...]")
        if tail:
            kept.extend(_summarize(v, items, chars, depth - 1) for v in value[-tail:])
        return kept
    if isinstance(value, dict):
        if depth <= 0:
            return f"{{object with {len(value)} keys}}" if value else {}
        limit = max(4, items * 4)
        out = {k: _summarize(v, items, chars, depth - 1) for k, v in list(value.items())[:limit]}
        if len(value) > limit:
            out["..."] = f"{len(value) - limit} more keys"
        return out
    return value


def _char_cost_prefix(chars: Sequence[str] | str, budget: int) -> int:
    """How many characters from the start of ``chars`` fit ``budget`` estimated tokens."""
    latin = 0
    cjk = 0
    count = 0
    for ch in chars:
        if is_cjk(ch):
            cjk += 1
        else:
            latin += 1
        if (latin + 3) // 4 + cjk > budget:
            break
        count += 1
    return count


def _prefix_len(text: str, budget: int) -> int:
    if budget <= 0:
        return 0
    return _char_cost_prefix(text[: budget * 4 + 4], budget)


def _suffix_len(text: str, budget: int) -> int:
    if budget <= 0:
        return 0
    window = text[-(budget * 4 + 4) :]
    return _char_cost_prefix(window[::-1], budget)


def _snap_head(head: str) -> str:
    """Cut at the last line break when one is near the end (keeps whole lines)."""
    cut = head.rfind("\n")
    return head[:cut] if cut >= len(head) * 0.8 else head


def _snap_tail(tail: str) -> str:
    cut = tail.find("\n")
    return tail[cut + 1 :] if 0 <= cut <= len(tail) * 0.2 else tail


# --- L-8: context checkpoints -----------------------------------------------------------


CHECKPOINT_SYSTEM_PROMPT = """\
You compress the working context of an AI agent so that it can continue its task with a \
fraction of the tokens. You will get the transcript of the task so far (user messages, the \
agent's replies and tool calls, tool results) and possibly the active plan.

Write a checkpoint that lets the agent continue exactly where it stopped, with these \
sections (skip a section that would be empty):
1. Goal: what the user ultimately wants.
2. Current task: what the agent is doing right now.
3. Constraints and preferences the user stated.
4. Decisions made, and why.
5. Facts learned.
6. Exact values: ids, keys, names, numbers, URLs, paths, quoted verbatim.
7. Tool results that still matter (condensed).
8. Files read or produced.
9. Open questions.
10. Next steps.

Be faithful: never invent anything; keep exact values verbatim; write in the language of the \
conversation. Output only the checkpoint, wrapped in <context_checkpoint> and \
</context_checkpoint>."""


def is_checkpoint(message: Message) -> bool:
    return message.kind == CHECKPOINT_KIND


def model_view(messages: Sequence[Message]) -> list[Message]:
    """SPEC L-8: what the model sees: system messages, then the last checkpoint and after."""
    last = next((i for i in range(len(messages) - 1, -1, -1) if is_checkpoint(messages[i])), None)
    if last is None:
        return list(messages)
    return [m for m in messages[:last] if m.role == "system"] + list(messages[last:])


def needs_checkpoint(
    messages: Sequence[Message], context_window: int, max_tokens: int, *, extra_tokens: int = 0
) -> bool:
    """SPEC L-8: whether the run's own messages (the model view, less thread history) exceed
    80% of the window (or the room left by ``max_tokens``, if that is smaller).

    ``extra_tokens`` adds what else the request carries (the tool schemas). False when there
    is nothing after the system prompt and the last checkpoint to compress.
    """
    view = [m for m in model_view(messages) if m.kind != "history"]
    if not any(m.role != "system" and not is_checkpoint(m) for m in view):
        return False
    limit = int(context_window * CHECKPOINT_THRESHOLD)
    room = context_window - max_tokens
    if room > 0:
        limit = min(limit, room)
    return estimate_messages_tokens(view) + extra_tokens > limit


def compression_due(tokens: int, failed_at: int, context_window: int) -> bool:
    """SPEC L-8: whether a compression may be tried with the run's messages at ``tokens``,
    its last one having failed at ``failed_at`` tokens (0: none failed since the last
    checkpoint): only once they have grown by ``RETRY_GROWTH`` of the window since."""
    return failed_at <= 0 or tokens >= compression_retry_at(failed_at, context_window)


def compression_retry_at(failed_at: int, context_window: int) -> int:
    """SPEC L-8: the message tokens at which a compression that failed at ``failed_at`` is
    tried again."""
    return failed_at + int(context_window * RETRY_GROWTH)


def checkpoint_request_messages(
    messages: Sequence[Message], plan: Plan | None, *, budget_tokens: int | None = None
) -> list[Message]:
    """SPEC L-8: the request that asks the model to summarize everything after the system
    prompt (from the model view) into a checkpoint.

    The transcript is sent as text, so the request carries no tool calls. With
    ``budget_tokens`` the transcript is reduced (L-7 rules) to fit it.
    """
    body = [m for m in model_view(messages) if m.role != "system"]
    transcript = "\n\n".join(_transcript_entry(m) for m in body)
    if budget_tokens is not None:
        transcript = reduce_tool_result(transcript, budget_tokens)
    parts = []
    if plan is not None:
        parts.append(f"<active_plan>\n{_escaped_plan(plan)}\n</active_plan>")
    parts.append(f"<transcript>\n{transcript}\n</transcript>")
    parts.append("Write the context checkpoint now.")
    return [
        Message(role="system", content=CHECKPOINT_SYSTEM_PROMPT),
        Message(role="user", content="\n\n".join(parts)),
    ]


def clean_checkpoint_summary(text: str) -> str | None:
    """The checkpoint body of a summarization reply: code fences stripped, the text inside
    the tags if present. ``None`` for an empty reply (the compression failed; SPEC L-8 keeps
    the original messages then)."""
    body = _FENCE.sub("", (text or "").strip()).strip()
    start = body.find(_CHECKPOINT_OPEN)
    if start >= 0:
        body = body[start + len(_CHECKPOINT_OPEN) :]
    end = body.rfind(_CHECKPOINT_CLOSE)
    if end >= 0:
        body = body[:end]
    body = body.strip()
    return body or None


def checkpoint_message(summary: str, plan: Plan | None) -> Message:
    """SPEC L-8/P-4: the checkpoint message: a hidden user message with the plan JSON (if a
    plan is given) in front of ``<context_checkpoint>…</context_checkpoint>``.

    Raises ``ValueError`` for an empty summary (see ``clean_checkpoint_summary``).
    """
    body = clean_checkpoint_summary(summary)
    if body is None:
        raise ValueError("the checkpoint summary is empty")
    content = f"{_CHECKPOINT_OPEN}\n{body}\n{_CHECKPOINT_CLOSE}"
    if plan is not None:
        content = f"<active_plan>\n{_escaped_plan(plan)}\n</active_plan>\n{content}"
    return Message(role="user", content=content, hidden=True, kind=CHECKPOINT_KIND)


def _escaped_plan(plan: Plan) -> str:
    # "<\/" is the same JSON string, and cannot close the surrounding tag
    return plan_json(plan).replace("</", "<\\/")


def _transcript_entry(message: Message) -> str:
    if is_checkpoint(message):
        return f"[earlier checkpoint]\n{message.text}"
    if message.role == "tool":
        label = message.name or message.tool_call_id or "tool"
        return f"[tool result: {label}]\n{message.text}"
    lines = [f"[{message.role}]"]
    if message.text:
        lines.append(message.text)
    lines.extend(f"-> call {c.name}({c.arguments}) id={c.id}" for c in message.tool_calls)
    return "\n".join(lines)
