"""Token estimates shared by the functional core (used by SPEC L-7, L-8, C-3)."""

from __future__ import annotations

from shared.agent.messages import Message, ToolCall
from shared.agent.tokens import (
    MESSAGE_OVERHEAD_TOKENS,
    estimate_message_tokens,
    estimate_messages_tokens,
    estimate_tokens,
    is_cjk,
)

# SPEC L-7, L-8, C-3: every budget decision uses these estimates


def test_empty_text_is_zero() -> None:
    assert estimate_tokens("") == 0


def test_latin_is_about_four_chars_a_token() -> None:
    assert estimate_tokens("a") == 1
    assert estimate_tokens("abcd") == 1
    assert estimate_tokens("abcde") == 2
    assert estimate_tokens("x" * 400) == 100


def test_cjk_counts_one_each() -> None:
    assert estimate_tokens("冲突") == 2
    assert estimate_tokens("模组冲突abcd") == 5
    assert is_cjk("冲") and is_cjk("한") and not is_cjk("a")


def test_same_algorithm_as_the_scripted_model() -> None:
    # the scripted model's copy must agree until it imports this one
    import re

    def reference(text: str) -> int:
        if not text:
            return 0
        cjk = len(re.findall(r"[\u3000-\u9fff\uac00-\ud7af]", text))
        return max(1, (len(text) - cjk + 3) // 4 + cjk)

    for text in ("", "a", "hello world", "你好，世界", "mixed 中文 text 한국어", "x" * 1001):
        assert estimate_tokens(text) == reference(text)


def test_message_tokens_count_text_and_tool_calls() -> None:
    plain = Message(role="user", content="abcd")
    assert estimate_message_tokens(plain) == MESSAGE_OVERHEAD_TOKENS + 1
    call = Message(
        role="assistant", content="", tool_calls=(ToolCall(id="c1", name="calc", arguments="{}"),)
    )
    assert estimate_message_tokens(call) > MESSAGE_OVERHEAD_TOKENS
    assert estimate_messages_tokens([plain, call]) == estimate_message_tokens(
        plain
    ) + estimate_message_tokens(call)
