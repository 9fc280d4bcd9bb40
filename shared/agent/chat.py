"""The chat node's request: system prompt assembly and quotes (SPEC C-1, C-2).

One model call, no loop. Quotes (retrieved passages given with the run) are rendered with a
template and go into the system prompt, or into the user message when ``quote_role`` is
``user`` or the quote prompt contains ``{{question}}``. History is passed through as given:
trim the result with ``shared.agent.history.trim_history`` (C-3).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from shared.agent.messages import Message
from shared.agent.spec import AgentSpec

__all__ = [
    "DATASET_QUOTE_TEMPLATE",
    "DEFAULT_QUOTE_SYSTEM_PROMPT",
    "DEFAULT_QUOTE_TEMPLATE",
    "DEFAULT_QUOTE_USER_PROMPT",
    "QUOTE_SEPARATOR",
    "SYSTEM_PROMPT_SEPARATOR",
    "Quote",
    "build_chat_messages",
    "build_chat_messages_for_spec",
    "fill_template",
    "join_system_prompt",
    "quote_goes_to_user",
    "render_quotes",
    "stream_enabled",
]

SYSTEM_PROMPT_SEPARATOR = "\n\n===---===---===\n\n"
QUOTE_SEPARATOR = "\n------\n"
DEFAULT_QUOTE_TEMPLATE = "{{q}}\n{{a}}"
DATASET_QUOTE_TEMPLATE = "[{{index}}] Source: {{source}}\n{{q}}\n{{a}}"
"""Quotes taken from a dataset (a chat agent's ``dataset``) when the agent keeps the default
template: the source goes with each passage, so the model can cite it."""

_REFERENCE_BLOCK = """\
Use the content inside <Reference></Reference> as the reference for this conversation:

<Reference>
{{quote}}
</Reference>

Answer requirements:
- If you are not sure of the answer, ask for clarification.
- Do not mention that the knowledge comes from <Reference></Reference>.
- Keep the answer consistent with what <Reference></Reference> says.
- Format the answer with Markdown.
- Answer in the same language as the question."""

DEFAULT_QUOTE_SYSTEM_PROMPT = _REFERENCE_BLOCK
"""C-2: the quote prompt added to the system prompt (quote_role system)."""

DEFAULT_QUOTE_USER_PROMPT = _REFERENCE_BLOCK + '\n\nQuestion: """{{question}}"""'
"""C-2: the user message that carries the quotes and the question (quote_role user)."""

_PLACEHOLDER = re.compile(r"\{\{\s*(\w+)\s*\}\}")

QuoteRole = Literal["system", "user"]


@dataclass(frozen=True, slots=True)
class Quote:
    """A retrieved passage: ``q`` (question or chunk), ``a`` (answer, optional), ``source``."""

    q: str
    a: str = ""
    source: str = ""

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Quote:
        return cls(
            q=str(d.get("q") or ""), a=str(d.get("a") or ""), source=str(d.get("source") or "")
        )

    def to_dict(self) -> dict[str, str]:
        return {"q": self.q, "a": self.a, "source": self.source}


def fill_template(template: str, values: Mapping[str, str]) -> str:
    """Replace ``{{name}}`` placeholders in one pass (a value that itself contains
    ``{{...}}`` is not expanded again); unknown placeholders stay as they are."""
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), template)


def join_system_prompt(*parts: str | None) -> str:
    """SPEC C-1: the non-empty parts joined by ``\\n\\n===---===---===\\n\\n``."""
    return SYSTEM_PROMPT_SEPARATOR.join(p for p in parts if p and p.strip())


def render_quotes(
    quotes: Sequence[Quote | Mapping[str, Any]], template: str = DEFAULT_QUOTE_TEMPLATE
) -> str:
    """SPEC C-2: each quote through the template (``{{q}}``, ``{{a}}``, ``{{source}}``,
    ``{{index}}`` 1-based), joined by ``\\n------\\n``."""
    rendered: list[str] = []
    for index, raw in enumerate(quotes, start=1):
        quote = raw if isinstance(raw, Quote) else Quote.from_dict(raw)
        values = {"q": quote.q, "a": quote.a, "source": quote.source, "index": str(index)}
        rendered.append(fill_template(template, values).strip())
    return QUOTE_SEPARATOR.join(rendered)


def quote_goes_to_user(quote_role: QuoteRole | str, quote_prompt: str | None) -> bool:
    """SPEC C-2: quotes go into the user message when the role is ``user`` or the quote
    prompt contains ``{{question}}``."""
    return quote_role == "user" or (
        quote_prompt is not None and _has_placeholder(quote_prompt, "question")
    )


def build_chat_messages(
    *,
    question: str,
    history: Sequence[Message] = (),
    quotes: Sequence[Quote | Mapping[str, Any]] = (),
    profile_system_prompt: str = "",
    system_prompt: str = "",
    quote_role: QuoteRole | str = "system",
    quote_template: str = DEFAULT_QUOTE_TEMPLATE,
    quote_prompt: str | None = None,
) -> list[Message]:
    """SPEC C-1/C-2: ``[system?] + history + [user]`` for one chat call.

    The system message (omitted when empty) joins the profile's default prompt, the agent's
    prompt and, for system-role quotes, the filled quote prompt. For user-role quotes the
    user message is the quote prompt with ``{{quote}}`` and ``{{question}}`` filled. Without
    quotes the user message is the question as given.
    """
    quote_part = ""
    user_text = question
    if quotes:
        quote_text = render_quotes(quotes, quote_template)
        if quote_goes_to_user(quote_role, quote_prompt):
            prompt = quote_prompt or DEFAULT_QUOTE_USER_PROMPT
            user_text = _fill_quote_prompt(prompt, quote_text, question, need_question=True)
        else:
            prompt = quote_prompt or DEFAULT_QUOTE_SYSTEM_PROMPT
            quote_part = _fill_quote_prompt(prompt, quote_text, question, need_question=False)
    system = join_system_prompt(profile_system_prompt, system_prompt, quote_part)
    messages: list[Message] = []
    if system:
        messages.append(Message(role="system", content=system))
    messages.extend(history)
    messages.append(Message(role="user", content=user_text))
    return messages


def build_chat_messages_for_spec(
    spec: AgentSpec,
    *,
    question: str,
    history: Sequence[Message] = (),
    quotes: Sequence[Quote | Mapping[str, Any]] = (),
    profile_system_prompt: str | None = None,
) -> list[Message]:
    """``build_chat_messages`` with the spec's fields. The profile's default system prompt is
    taken from an inline profile unless given (a named profile is resolved by the caller)."""
    if profile_system_prompt is None:
        model = spec.model
        profile_system_prompt = "" if isinstance(model, str) else model.default_system_prompt
    return build_chat_messages(
        question=question,
        history=history,
        quotes=quotes,
        profile_system_prompt=profile_system_prompt,
        system_prompt=spec.system_prompt,
        quote_role=spec.quote_role,
        quote_template=spec.quote_template,
        quote_prompt=spec.quote_prompt,
    )


def stream_enabled(spec: AgentSpec, delta_kind: str) -> bool:
    """SPEC C-4: whether live deltas of a kind are streamed: ``reasoning`` behind
    ``stream_reasoning``, answer ``text`` behind ``stream_answer`` (both default true). The
    answer is the run's text either way; the flags only gate what is published live."""
    if delta_kind == "reasoning":
        return spec.stream_reasoning
    if delta_kind == "text":
        return spec.stream_answer
    return True


def _fill_quote_prompt(prompt: str, quote_text: str, question: str, *, need_question: bool) -> str:
    filled = fill_template(prompt, {"quote": quote_text, "question": question})
    if not _has_placeholder(prompt, "quote"):
        filled = f"{filled}\n\n{quote_text}"  # a prompt without {{quote}} would lose them
    if need_question and not _has_placeholder(prompt, "question"):
        filled = f"{filled}\n\n{question}"
    return filled


def _has_placeholder(text: str, name: str) -> bool:
    return any(m.group(1) == name for m in _PLACEHOLDER.finditer(text))
