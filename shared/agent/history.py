"""History trimming to the request budget (SPEC C-3, used first by L-8).

Leading system messages and context checkpoints are always kept. The rest is grouped by user
turn (a user message and the assistant/tool messages after it); groups are kept newest first
while they fit, the newest one always. A group never ends between an assistant tool call and
its result, so a call and its result are never separated.
"""

from __future__ import annotations

from collections.abc import Sequence

from shared.agent.messages import Message
from shared.agent.tokens import estimate_messages_tokens

__all__ = ["group_turns", "request_budget", "trim_history"]

_CHECKPOINT_KIND = "context_checkpoint"


def request_budget(context_window: int, max_tokens: int) -> int:
    """SPEC L-8/C-3: what a request may hold: ``context_window - max_tokens``."""
    return max(0, context_window - max_tokens)


def _pinned(message: Message) -> bool:
    return message.role == "system" or message.kind == _CHECKPOINT_KIND


def group_turns(messages: Sequence[Message]) -> list[list[Message]]:
    """Split messages into user turns. A user message starts a new group unless a tool call
    of the current group still waits for its result (then it joins the group). Messages
    before the first user message form a group of their own."""
    groups: list[list[Message]] = []
    open_calls: set[str] = set()
    for message in messages:
        if not groups or (message.role == "user" and not open_calls):
            groups.append([message])
        else:
            groups[-1].append(message)
        if message.role == "assistant":
            open_calls.update(c.id for c in message.tool_calls)
        elif message.role == "tool" and message.tool_call_id is not None:
            open_calls.discard(message.tool_call_id)
    return groups


def trim_history(messages: Sequence[Message], budget_tokens: int) -> list[Message]:
    """SPEC C-3: the messages that fit ``budget_tokens``, in their original order.

    The leading run of system messages and checkpoints is always kept, as is any checkpoint
    after it (its whole group is kept). Then user-turn groups, newest first, while they fit;
    the newest group is kept even when it alone overflows. The first group that does not fit
    ends the walk, so no gap opens in the middle of the history.
    """
    lead = 0
    while lead < len(messages) and _pinned(messages[lead]):
        lead += 1
    head = list(messages[:lead])
    groups = group_turns(messages[lead:])
    if not groups:
        return head
    remaining = budget_tokens - estimate_messages_tokens(head)
    keep = [False] * len(groups)
    for i, group in enumerate(groups):
        if any(m.kind == _CHECKPOINT_KIND for m in group):
            keep[i] = True
            remaining -= estimate_messages_tokens(group)
    newest = len(groups) - 1
    for i in range(newest, -1, -1):
        if keep[i]:
            continue
        cost = estimate_messages_tokens(groups[i])
        if i != newest and cost > remaining:
            break
        keep[i] = True
        remaining -= cost
    return head + [m for i, group in enumerate(groups) if keep[i] for m in group]
