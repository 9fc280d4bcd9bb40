"""A thread's earlier turns as the history of a new run on it (pure).

A run on a thread reads the messages of the thread's earlier runs by reference
(``shared.store.lineage``) and sees them marked ``kind="history"``: the compression policy
(L-8) does not count them as the run's own, the scripted model does not count them as rounds,
and the request builder trims them (C-3).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from shared.agent.messages import Message

__all__ = ["HISTORY_KIND", "history_view", "thread_history"]

HISTORY_KIND = "history"


def thread_history(runs: Sequence[Sequence[Message]]) -> list[Message]:
    """The history a new run takes from its thread's earlier runs (oldest run first).

    Of each run only its own conversation is taken: no system prompts (the new run has its
    own), no context checkpoints or hidden messages, no history it copied itself. A tool call
    without its result, or a result without its call, is left out: a dangling tool call is a
    400 at most providers. Pairs are matched within a run (ids repeat across runs).
    """
    out: list[Message] = []
    for messages in runs:
        out.extend(_run_history(messages))
    return out


def _run_history(messages: Sequence[Message]) -> list[Message]:
    return [m for _, m in _history(messages, keep_copies=False)]


def history_view(messages: Sequence[Message]) -> list[tuple[int, Message]]:
    """One earlier run's messages as history, each with its index in ``messages``. Copies of
    history the run holds itself (``kind="history"``, stored before history was read by
    reference) are kept as they are: they are the thread's earlier turns."""
    return _history(messages, keep_copies=True)


def _history(messages: Sequence[Message], *, keep_copies: bool) -> list[tuple[int, Message]]:
    def own(m: Message) -> bool:
        return m.role != "system" and not m.kind and not m.hidden

    mine = [m for m in messages if own(m)]
    answered = {m.tool_call_id for m in mine if m.role == "tool"}
    called = {c.id for m in mine for c in m.tool_calls}
    out: list[tuple[int, Message]] = []
    for i, m in enumerate(messages):
        if keep_copies and m.kind == HISTORY_KIND:
            out.append((i, m))
            continue
        if not own(m) or (m.role == "tool" and m.tool_call_id not in called):
            continue
        if m.tool_calls:
            m = replace(m, tool_calls=tuple(c for c in m.tool_calls if c.id in answered))
        out.append((i, replace(m, kind=HISTORY_KIND)))
    return out
