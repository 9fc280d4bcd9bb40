"""Cheap, deterministic token estimates (no tokenizer: the functional core stays pure).

About 4 characters a token for Latin text, 1 token for each CJK character. The same text
always gives the same estimate, so decisions that depend on it replay identically.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from shared.agent.messages import Message

__all__ = [
    "MESSAGE_OVERHEAD_TOKENS",
    "estimate_message_tokens",
    "estimate_messages_tokens",
    "estimate_tokens",
    "is_cjk",
]

_CJK = re.compile(r"[\u3000-\u9fff\uac00-\ud7af]")

MESSAGE_OVERHEAD_TOKENS = 4
"""Tokens a message costs beyond its text (role, separators), as the scripted model counts."""


def is_cjk(char: str) -> bool:
    """Whether a character counts as a whole token (CJK ideographs, kana, hangul, punctuation)."""
    return bool(_CJK.fullmatch(char))


def estimate_tokens(text: str) -> int:
    """A cheap, deterministic token estimate: about 4 characters a token, CJK 1 each."""
    if not text:
        return 0
    cjk = len(_CJK.findall(text))
    return max(1, (len(text) - cjk + 3) // 4 + cjk)


def estimate_message_tokens(message: Message) -> int:
    """Tokens one message costs in a request: its text, its tool calls and a small overhead."""
    total = MESSAGE_OVERHEAD_TOKENS + estimate_tokens(message.text)
    for call in message.tool_calls:
        total += estimate_tokens(call.name) + estimate_tokens(call.arguments) + 2
    return total


def estimate_messages_tokens(messages: Iterable[Message]) -> int:
    """The summed estimate of several messages."""
    return sum(estimate_message_tokens(m) for m in messages)
