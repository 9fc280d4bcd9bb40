"""The ask_user tool: questions for the user, and how the answer reaches the model (SPEC A-*).

``parse_ask`` turns tool-call arguments into an ``Ask`` or an error text that goes back to the
model as the tool result (A-1). ``render_answer`` turns the user's answers into the tool
message for the ask's call id (A-3); ``render_timed_out`` is the reaper's answer (A-4).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared.agent.arguments import ArgumentsError, invalid_arguments_text, parse_arguments

__all__ = [
    "ASK_USER",
    "ASK_USER_TOOL",
    "NO_ANSWER",
    "NO_ANSWER_TIMED_OUT",
    "TIMEOUT_TEXT",
    "TOOL_DEF",
    "Ask",
    "AskOption",
    "AskQuestion",
    "parse_ask",
    "render_answer",
    "render_timed_out",
]

ASK_USER = "ask_user"
NO_ANSWER = "(no answer)"
NO_ANSWER_TIMED_OUT = "(no answer: timed out)"
TIMEOUT_TEXT = NO_ANSWER_TIMED_OUT  # alias used by the engine (SPEC A-4)

MAX_QUESTIONS = 3
MIN_OPTIONS = 2
MAX_OPTIONS = 4
MAX_LEGACY_OPTIONS = 5


@dataclass(frozen=True, slots=True)
class AskOption:
    label: str
    value: str

    def to_dict(self) -> dict[str, str]:
        return {"label": self.label, "value": self.value}


@dataclass(frozen=True, slots=True)
class AskQuestion:
    question: str
    options: tuple[AskOption, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"question": self.question, "options": [o.to_dict() for o in self.options]}


@dataclass(frozen=True, slots=True)
class Ask:
    """A valid ask: why the model is blocked and 1-3 questions with options."""

    reason: str
    questions: tuple[AskQuestion, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"reason": self.reason, "questions": [q.to_dict() for q in self.questions]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Ask:
        return cls(
            reason=str(d.get("reason") or ""),
            questions=tuple(
                AskQuestion(
                    question=str(q["question"]),
                    options=tuple(
                        AskOption(label=str(o["label"]), value=str(o["value"]))
                        for o in q.get("options") or ()
                    ),
                )
                for q in d.get("questions") or ()
            ),
        )


ASK_USER_TOOL: dict[str, Any] = {
    "name": ASK_USER,
    "description": (
        "Ask the user and wait for the answer. Use it only for hard blockers: missing "
        "required input, an unavailable tool, or an unclear goal. Do not ask about "
        "preferences or anything you can reasonably assume. Give 1-3 questions, each with "
        "2-4 options the user can pick; the user may also answer in their own words."
    ),
    "parameters": {
        "type": "object",
        "properties": {
            "reason": {"type": "string", "description": "Why you cannot go on without the user."},
            "questions": {
                "type": "array",
                "minItems": 1,
                "maxItems": MAX_QUESTIONS,
                "items": {
                    "type": "object",
                    "properties": {
                        "question": {"type": "string"},
                        "options": {
                            "type": "array",
                            "minItems": MIN_OPTIONS,
                            "maxItems": MAX_OPTIONS,
                            "items": {
                                "type": "object",
                                "properties": {
                                    "label": {
                                        "type": "string",
                                        "description": "What the user sees.",
                                    },
                                    "value": {
                                        "type": "string",
                                        "description": "What you get back when it is picked.",
                                    },
                                },
                                "required": ["label", "value"],
                            },
                        },
                    },
                    "required": ["question", "options"],
                },
            },
        },
        "required": ["reason", "questions"],
    },
}
TOOL_DEF = ASK_USER_TOOL  # alias used by the engine's catalog


def parse_ask(args: Mapping[str, Any] | str) -> Ask | str:
    """SPEC A-1: an ``Ask``, or the error text to give the model as the tool result.

    Accepts ``{reason, questions: [1-3 x {question, options: [2-4 x {label, value}]}]}`` and
    the single-question form ``{question, options: [2-5 strings]}``, converted to one
    question whose options have label = value.
    """
    if isinstance(args, str):
        try:
            parsed: Mapping[str, Any] = parse_arguments(args)
        except ArgumentsError as exc:
            return _invalid(str(exc))
    elif isinstance(args, Mapping):
        parsed = args
    else:
        return _invalid("expected a JSON object")

    reason = parsed.get("reason")
    reason_text = "" if reason is None else str(reason).strip()
    if "questions" in parsed:
        questions = _questions(parsed["questions"])
    elif "question" in parsed:
        legacy = _question(parsed, "", MAX_LEGACY_OPTIONS)
        questions = legacy if isinstance(legacy, str) else (legacy,)
    else:
        return _invalid("missing required field 'questions'")
    if isinstance(questions, str):
        return _invalid(questions)
    return Ask(reason=reason_text, questions=questions)


def render_answer(ask: Ask, answers: Sequence[str]) -> str:
    """SPEC A-3: the tool message for the ask: per question ``## <question>`` then
    ``Answer: <answer>``; an answer equal to an option's value shows ``label - value``;
    a missing or blank answer shows ``(no answer)``.
    """
    blocks: list[str] = []
    for i, question in enumerate(ask.questions):
        raw = answers[i] if i < len(answers) else None
        text = raw.strip() if isinstance(raw, str) else ""
        blocks.append(_block(question, _shown(question, text) if text else NO_ANSWER))
    return "\n\n".join(blocks)


def render_timed_out(ask: Ask) -> str:
    """SPEC A-4: the answer the reaper gives an expired ask."""
    return "\n\n".join(_block(q, NO_ANSWER_TIMED_OUT) for q in ask.questions)


def _block(question: AskQuestion, answer: str) -> str:
    return f"## {question.question}\nAnswer: {answer}"


def _shown(question: AskQuestion, answer: str) -> str:
    for option in question.options:
        if option.value == answer:
            return option.value if option.label == option.value else f"{option.label} - {answer}"
    return answer


def _invalid(message: str) -> str:
    return invalid_arguments_text(ASK_USER, message)


def _questions(value: Any) -> tuple[AskQuestion, ...] | str:
    if not isinstance(value, list):
        return "'questions' must be an array"
    if not 1 <= len(value) <= MAX_QUESTIONS:
        return f"'questions' must have 1 to {MAX_QUESTIONS} items"
    out: list[AskQuestion] = []
    for i, item in enumerate(value):
        if not isinstance(item, Mapping):
            return f"'questions[{i}]' must be an object"
        question = _question(item, f"questions[{i}].", MAX_OPTIONS)
        if isinstance(question, str):
            return question
        out.append(question)
    return tuple(out)


def _question(item: Mapping[str, Any], where: str, max_options: int) -> AskQuestion | str:
    text = item.get("question")
    if not isinstance(text, str) or not text.strip():
        return f"'{where}question' must be a non-empty string"
    raw_options = item.get("options")
    if not isinstance(raw_options, list):
        return f"'{where}options' must be an array"
    if not MIN_OPTIONS <= len(raw_options) <= max_options:
        return f"'{where}options' must have {MIN_OPTIONS} to {max_options} items"
    options: list[AskOption] = []
    for j, raw in enumerate(raw_options):
        option = _option(raw)
        if option is None:
            return (
                f"'{where}options[{j}]' must be a non-empty string or an object with "
                "a non-empty label and value"
            )
        options.append(option)
    return AskQuestion(question=text.strip(), options=tuple(options))


def _option(raw: Any) -> AskOption | None:
    if isinstance(raw, str):
        text = raw.strip()
        return AskOption(label=text, value=text) if text else None
    if not isinstance(raw, Mapping):
        return None
    label = raw.get("label", raw.get("summary"))
    value = raw.get("value")
    label_text = label.strip() if isinstance(label, str) else ""
    value_text = value.strip() if isinstance(value, str) else ""
    if not label_text and not value_text:
        return None
    return AskOption(label=label_text or value_text, value=value_text or label_text)
