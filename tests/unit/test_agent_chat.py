"""Chat node request building (SPEC C-1, C-2)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shared.agent.chat import (
    DEFAULT_QUOTE_SYSTEM_PROMPT,
    DEFAULT_QUOTE_USER_PROMPT,
    QUOTE_SEPARATOR,
    SYSTEM_PROMPT_SEPARATOR,
    Quote,
    build_chat_messages,
    build_chat_messages_for_spec,
    fill_template,
    join_system_prompt,
    quote_goes_to_user,
    render_quotes,
)
from shared.agent.messages import Message
from shared.agent.spec import AgentSpec, ModelProfile

QUOTES: list[Quote | Mapping[str, Any]] = [
    Quote(q="What is treadle?", a="A durable agent runtime.", source="faq.md"),
    {"q": "Q2"},
]

# SPEC C-1


def test_separators_are_exact() -> None:
    assert SYSTEM_PROMPT_SEPARATOR == "\n\n===---===---===\n\n"
    assert QUOTE_SEPARATOR == "\n------\n"


def test_system_prompt_joins_non_empty_parts() -> None:
    assert join_system_prompt("A", "B", "C") == "A\n\n===---===---===\n\nB\n\n===---===---===\n\nC"
    assert join_system_prompt("", "B", None) == "B"
    assert join_system_prompt("A", "   ", "C") == "A\n\n===---===---===\n\nC"
    assert join_system_prompt("", None) == ""


# SPEC C-2: rendering


def test_render_quotes_template_and_separator() -> None:
    text = render_quotes(QUOTES, "{{index}}. {{q}} => {{a}} ({{source}})")
    assert text == (
        "1. What is treadle? => A durable agent runtime. (faq.md)\n------\n2. Q2 =>  ()"
    )


def test_default_template() -> None:
    assert render_quotes(QUOTES) == ("What is treadle?\nA durable agent runtime.\n------\nQ2")


def test_template_fill_is_single_pass() -> None:
    # a quote containing a placeholder is not expanded again
    assert render_quotes([Quote(q="{{a}}", a="secret")], "{{q}}|{{a}}") == "{{a}}|secret"
    assert fill_template("{{x}} {{ y }}", {"y": "Y"}) == "{{x}} Y"


# SPEC C-2: where quotes go


def test_quote_role_rules() -> None:
    assert not quote_goes_to_user("system", None)
    assert quote_goes_to_user("user", None)
    assert quote_goes_to_user("system", "Ref: {{quote}}\nQ: {{question}}")
    assert not quote_goes_to_user("system", "Ref: {{quote}}")


def test_system_role_quotes_go_into_the_system_prompt() -> None:
    msgs = build_chat_messages(
        question="Is it durable?",
        quotes=QUOTES,
        profile_system_prompt="PROFILE",
        system_prompt="AGENT",
    )
    assert [m.role for m in msgs] == ["system", "user"]
    parts = msgs[0].text.split(SYSTEM_PROMPT_SEPARATOR)
    assert parts[:2] == ["PROFILE", "AGENT"]
    assert parts[2] == DEFAULT_QUOTE_SYSTEM_PROMPT.replace("{{quote}}", render_quotes(QUOTES))
    assert msgs[1].text == "Is it durable?"


def test_question_placeholder_moves_quotes_to_the_user_message() -> None:
    prompt = "Reference:\n{{quote}}\n\nQuestion: {{question}}"
    msgs = build_chat_messages(
        question="Is it durable?", quotes=QUOTES, system_prompt="AGENT", quote_prompt=prompt
    )
    assert msgs[0].text == "AGENT"  # no quote part in the system prompt
    assert msgs[-1].role == "user"
    assert msgs[-1].text == f"Reference:\n{render_quotes(QUOTES)}\n\nQuestion: Is it durable?"


def test_user_role_with_the_default_prompt() -> None:
    msgs = build_chat_messages(question="Is it durable?", quotes=QUOTES, quote_role="user")
    assert [m.role for m in msgs] == ["user"]  # no system message when every part is empty
    expected = DEFAULT_QUOTE_USER_PROMPT.replace("{{quote}}", render_quotes(QUOTES)).replace(
        "{{question}}", "Is it durable?"
    )
    assert msgs[0].text == expected
    assert "{{" not in msgs[0].text


def test_user_role_prompt_without_question_placeholder_keeps_the_question() -> None:
    msgs = build_chat_messages(
        question="Is it durable?", quotes=QUOTES, quote_role="user", quote_prompt="Ref: {{quote}}"
    )
    assert msgs[-1].text.endswith("\n\nIs it durable?")
    assert msgs[-1].text.startswith("Ref: What is treadle?")


def test_no_quotes_means_no_quote_prompt() -> None:
    msgs = build_chat_messages(question="hi", system_prompt="AGENT", quote_role="user")
    assert [(m.role, m.text) for m in msgs] == [("system", "AGENT"), ("user", "hi")]


def test_history_sits_between_system_and_question() -> None:
    history = [Message(role="user", content="before"), Message(role="assistant", content="ok")]
    msgs = build_chat_messages(question="now", history=history, system_prompt="S")
    assert [m.text for m in msgs] == ["S", "before", "ok", "now"]


def test_from_spec() -> None:
    spec = AgentSpec(
        kind="chat",
        model=ModelProfile(default_system_prompt="PROFILE"),
        system_prompt="AGENT",
        quote_template="[{{index}}] {{q}}",
        quote_prompt="Use:\n{{quote}}\nAnswer: {{question}}",
    )
    msgs = build_chat_messages_for_spec(spec, question="Q?", quotes=QUOTES)
    assert msgs[0].text == "PROFILE" + SYSTEM_PROMPT_SEPARATOR + "AGENT"
    assert msgs[-1].text == "Use:\n[1] What is treadle?\n------\n[2] Q2\nAnswer: Q?"
    named = AgentSpec(kind="chat", model="demo", system_prompt="AGENT")
    assert build_chat_messages_for_spec(named, question="Q", profile_system_prompt="P")[0].text == (
        "P" + SYSTEM_PROMPT_SEPARATOR + "AGENT"
    )
