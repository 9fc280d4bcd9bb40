"""ask_user: parsing, the tool definition, answer rendering (SPEC A-1, A-3, A-4)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from shared.agent.arguments import validate_against_schema
from shared.agent.ask import (
    ASK_USER_TOOL,
    NO_ANSWER,
    NO_ANSWER_TIMED_OUT,
    TIMEOUT_TEXT,
    TOOL_DEF,
    Ask,
    AskOption,
    AskQuestion,
    parse_ask,
    render_answer,
    render_timed_out,
)

TWO_QUESTIONS: dict[str, Any] = {
    "reason": "The destination decides the booking.",
    "questions": [
        {
            "question": "Which city?",
            "options": [
                {"label": "Paris, France", "value": "paris"},
                {"label": "Rome, Italy", "value": "rome"},
            ],
        },
        {"question": "Class?", "options": [{"label": "eco", "value": "eco"}, "business"]},
    ],
}


def _ask() -> Ask:
    ask = parse_ask(TWO_QUESTIONS)
    assert isinstance(ask, Ask)
    return ask


# SPEC A-1: the full form


def test_full_form() -> None:
    ask = _ask()
    assert ask.reason == "The destination decides the booking."
    assert ask.questions[0] == AskQuestion(
        "Which city?", (AskOption("Paris, France", "paris"), AskOption("Rome, Italy", "rome"))
    )
    assert ask.questions[1].options == (AskOption("eco", "eco"), AskOption("business", "business"))


def test_raw_json_text_is_parsed() -> None:
    assert parse_ask(json.dumps(TWO_QUESTIONS)) == _ask()


def test_legacy_single_question_form_is_converted() -> None:
    # SPEC A-1: the older single-question form {question, options: [2-5 strings]}
    ask = parse_ask(
        {
            "question": " Which mod loader? ",
            "options": ["Fabric", "Forge", "Quilt", "NeoForge", "x"],
        }
    )
    assert isinstance(ask, Ask)
    assert ask.reason == ""
    assert len(ask.questions) == 1
    assert ask.questions[0].question == "Which mod loader?"
    assert [(o.label, o.value) for o in ask.questions[0].options] == [
        ("Fabric", "Fabric"),
        ("Forge", "Forge"),
        ("Quilt", "Quilt"),
        ("NeoForge", "NeoForge"),
        ("x", "x"),
    ]


def test_upstream_summary_key_is_a_label() -> None:
    ask = parse_ask(
        {
            "reason": "r",
            "questions": [
                {"question": "q", "options": [{"summary": "A", "value": "a"}, {"value": "b"}]}
            ],
        }
    )
    assert isinstance(ask, Ask)
    assert ask.questions[0].options == (AskOption("A", "a"), AskOption("b", "b"))


def _q(n_options: int) -> dict[str, Any]:
    return {"question": "q", "options": [f"o{i}" for i in range(n_options)]}


@pytest.mark.parametrize(
    "args",
    [
        {"reason": "r"},
        {"reason": "r", "questions": []},
        {"reason": "r", "questions": [_q(2)] * 4},
        {"reason": "r", "questions": [_q(1)]},
        {"reason": "r", "questions": [_q(5)]},  # the full form allows 2-4
        {"reason": "r", "questions": [{"question": "", "options": ["a", "b"]}]},
        {"reason": "r", "questions": [{"question": "q", "options": ["a", ""]}]},
        {"reason": "r", "questions": [{"question": "q", "options": ["a", {"label": ""}]}]},
        {"reason": "r", "questions": ["q"]},
        {"reason": "r", "questions": "q"},
        {"question": "q", "options": ["a"]},
        {"question": "q", "options": ["a", "b", "c", "d", "e", "f"]},  # legacy allows 2-5
        {"question": "q"},
    ],
)
def test_invalid_arguments_give_an_error_text(args: dict[str, Any]) -> None:
    # SPEC A-1: the error goes back to the model as the tool result
    result = parse_ask(args)
    assert isinstance(result, str)
    assert result.startswith("Invalid arguments for ask_user: ")


def test_unparseable_text() -> None:
    result = parse_ask("{not json")
    assert isinstance(result, str) and result.startswith("Invalid arguments for ask_user: ")


def test_round_trip() -> None:
    ask = _ask()
    assert Ask.from_dict(ask.to_dict()) == ask
    assert Ask.from_dict(json.loads(json.dumps(ask.to_dict()))) == ask
    # a stored pending ask carries more keys; they are ignored
    pending = {"kind": "ask", "ask_id": "call_1", "asked_at": "t", **ask.to_dict()}
    assert Ask.from_dict(pending) == ask


def test_tool_definition() -> None:
    assert TOOL_DEF is ASK_USER_TOOL
    assert ASK_USER_TOOL["name"] == "ask_user"
    description = ASK_USER_TOOL["description"]
    assert "hard blockers" in description
    assert "missing required input" in description
    assert "unavailable tool" in description
    assert "unclear goal" in description
    strict = {
        "reason": "r",
        "questions": [{"question": "q", "options": [{"label": "A", "value": "a"}] * 2}],
    }
    assert validate_against_schema(strict, ASK_USER_TOOL["parameters"]) is None
    # the tolerant forms parse_ask accepts are not all in the schema: the engine must hand
    # ask_user arguments to parse_ask, not to the generic schema check
    assert validate_against_schema(TWO_QUESTIONS, ASK_USER_TOOL["parameters"]) is not None
    json.dumps(ASK_USER_TOOL)


# SPEC A-3: answer rendering


def test_render_answer_label_value_and_free_text() -> None:
    text = render_answer(_ask(), ["rome", "first class please"])
    assert text == (
        "## Which city?\nAnswer: Rome, Italy - rome\n\n## Class?\nAnswer: first class please"
    )


def test_value_equal_to_label_shows_once() -> None:
    text = render_answer(_ask(), ["paris", "business"])
    assert text.endswith("## Class?\nAnswer: business")


def test_missing_and_blank_answers() -> None:
    assert NO_ANSWER == "(no answer)"
    assert render_answer(_ask(), ["paris"]).endswith("## Class?\nAnswer: (no answer)")
    assert render_answer(_ask(), ["  ", ""]) == (
        "## Which city?\nAnswer: (no answer)\n\n## Class?\nAnswer: (no answer)"
    )
    assert render_answer(_ask(), []).count("(no answer)") == 2


def test_extra_answers_are_ignored() -> None:
    assert render_answer(_ask(), ["paris", "eco", "extra"]).count("## ") == 2


def test_legacy_answer() -> None:
    ask = parse_ask({"question": "Loader?", "options": ["Fabric", "Forge"]})
    assert isinstance(ask, Ask)
    assert render_answer(ask, ["Forge"]) == "## Loader?\nAnswer: Forge"


# SPEC A-4: expiry


def test_timeout_text() -> None:
    assert NO_ANSWER_TIMED_OUT == "(no answer: timed out)"
    assert TIMEOUT_TEXT == NO_ANSWER_TIMED_OUT
    assert render_timed_out(_ask()) == (
        "## Which city?\nAnswer: (no answer: timed out)\n\n"
        "## Class?\nAnswer: (no answer: timed out)"
    )
