"""The offline demo model: deterministic, and every feature shows (plans, asks, writes for
approval, helper kinds with sensible answers)."""

from __future__ import annotations

import pytest

from shared.agent import kinds
from shared.agent.spec import AgentSpec
from shared.llm.base import ModelRequest
from shared.llm.demo import demo_reply

CLASSIFY = AgentSpec(
    kind="classify",
    categories=[
        {"key": "billing", "description": "invoices, refunds, payments and charges"},
        {"key": "technical", "description": "bugs, errors, crashes, login problems"},
        {"key": "other", "description": "anything else"},
    ],
)
EXTRACT = AgentSpec(
    kind="extract",
    fields=[
        {"name": "name", "type": "string", "required": True},
        {"name": "email", "type": "string"},
        {"name": "age", "type": "integer"},
        {"name": "date", "type": "string", "description": "the appointment date"},
        {"name": "city", "type": "string"},
        {"name": "plan", "type": "string", "enum": ["basic", "pro"]},
        {"name": "phone", "type": "string"},
    ],
)


def _helper(spec: AgentSpec, question: str) -> dict[str, object]:
    built = kinds.helper_request(spec, question=question, history=[], json_schema=False)
    reply = demo_reply(ModelRequest(messages=tuple(built.messages)))
    assert reply == demo_reply(ModelRequest(messages=tuple(built.messages)))  # deterministic
    return kinds.helper_result(spec, reply.text, question)


@pytest.mark.parametrize(
    ("question", "category"),
    [
        ("I was charged twice and want a refund", "billing"),
        ("The app crashes when I log in", "technical"),
        ("What's the weather like?", "other"),  # nothing shared: the last category
    ],
)
def test_classify_picks_the_category_whose_words_match(question: str, category: str) -> None:
    assert _helper(CLASSIFY, question)["category"] == category


def test_extract_fills_the_fields_it_finds_and_invents_none() -> None:
    text = (
        "Hi, I am writing because my name is Ada Lovelace, I'm 36 years old, email "
        "ada@example.com. Book me for 12 March 2026 on the pro plan. City: London."
    )
    result = _helper(EXTRACT, text)
    assert result == {
        "fields": {
            "name": "Ada Lovelace",
            "email": "ada@example.com",
            "age": 36,
            "date": "12 March 2026",
            "city": "London",
            "plan": "pro",
        },
        "success": True,
    }
    assert _helper(EXTRACT, "nothing useful here") == {"fields": {}, "success": False}


def test_expand_query_returns_variants() -> None:
    queries = _helper(AgentSpec(kind="expand_query"), "How do I reset my password?")["queries"]
    assert isinstance(queries, list) and queries[0] == "How do I reset my password?"
    assert len(queries) == 4 and all("reset password" in q for q in queries[1:])
    assert _helper(AgentSpec(kind="expand_query"), "hello")["queries"] == ["hello"]
