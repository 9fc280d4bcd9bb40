"""What to send the model this round (pure): messages, tools, tool_choice.

The model view starts at the last context checkpoint (L-8) and is trimmed to the window
(C-3); ``tool_choice`` comes from the anti-loop counters (L-3).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from shared.agent import chat, kinds
from shared.agent import output as output_mod
from shared.agent.attachments import READ_FILES, with_attachments
from shared.agent.compression import model_view
from shared.agent.history import request_budget, trim_history
from shared.agent.messages import Message
from shared.agent.plan import PLANNING_SYSTEM_PROMPT
from shared.agent.spec import AgentSpec, ModelProfile
from shared.agent.state import CatalogEntry, LoopState
from shared.agent.step import next_tool_choice
from shared.agent.tokens import estimate_tokens

__all__ = ["RequestPlan", "last_user_text", "plan_request", "split_question"]


@dataclass(frozen=True, slots=True)
class RequestPlan:
    messages: tuple[Message, ...]
    tools: tuple[CatalogEntry, ...] = ()
    tool_choice: str | None = None
    max_tokens: int | None = None
    response_format: dict[str, Any] | None = None


def last_user_text(messages: Sequence[Message]) -> str:
    """The text of the last user message ("" when there is none), without copying."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].role == "user":
            return messages[i].text
    return ""


def split_question(messages: Sequence[Message]) -> tuple[list[Message], str]:
    """The history before the last user message, and that message's text."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].role == "user":
            return list(messages[:i]), messages[i].text
    return list(messages), ""


def _agent_messages(
    spec: AgentSpec,
    profile: ModelProfile,
    messages: Sequence[Message],
    known_tokens: int | None = None,
) -> list[Message]:
    system = chat.join_system_prompt(
        profile.default_system_prompt,
        spec.system_prompt,
        PLANNING_SYSTEM_PROMPT if spec.plan else "",
        output_mod.output_instruction(spec.output_schema) if spec.output_schema else "",
    )
    view = model_view(messages)
    head = [Message(role="system", content=system)] if system else []
    budget = request_budget(profile.context_window, profile.max_tokens)
    if known_tokens is not None and known_tokens + estimate_tokens(system) + 8 <= budget:
        return head + view  # the stored count says it fits: no need to estimate each message
    return trim_history(head + view, budget)


def _chat_messages(
    spec: AgentSpec, profile: ModelProfile, messages: Sequence[Message], inputs: Mapping[str, Any]
) -> list[Message]:
    history, question = split_question(model_view(messages))
    msgs = chat.build_chat_messages_for_spec(
        spec,
        question=question,
        history=history,
        quotes=inputs.get("quotes") or (),
        profile_system_prompt=profile.default_system_prompt,
    )
    return trim_history(msgs, request_budget(profile.context_window, profile.max_tokens))


def plan_request(
    spec: AgentSpec,
    *,
    profile: ModelProfile,
    state: LoopState,
    messages: Sequence[Message],
    catalog: Mapping[str, CatalogEntry],
    plan: dict[str, Any] | None,
    inputs: Mapping[str, Any],
    known_tokens: int | None = None,
) -> RequestPlan:
    """``inputs``: quotes (C-2), last_result (H-1), attachments and, for a vision profile,
    ``images`` (data URLs loaded by the engine) — SPEC M-11, see ``attachments``.
    ``known_tokens``: the stored token estimate of ``messages``, when the caller has it (an
    upper bound of the model view's: trimming is skipped when that fits)."""
    if spec.kind == "chat":
        req = RequestPlan(
            tuple(_chat_messages(spec, profile, messages, inputs)), max_tokens=profile.max_tokens
        )
    elif spec.kind in ("classify", "extract", "expand_query"):
        req = _helper_request(spec, profile, messages, inputs.get("last_result"))
    else:
        req = RequestPlan(
            messages=tuple(_agent_messages(spec, profile, messages, known_tokens)),
            tools=tuple(catalog.values()),
            tool_choice=next_tool_choice(spec, state),
            max_tokens=profile.max_tokens,
            response_format=_output_format(spec, profile),
        )
    msgs = with_attachments(
        req.messages, inputs, vision=profile.vision, readable=READ_FILES in catalog
    )
    return replace(req, messages=tuple(msgs))


def _output_format(spec: AgentSpec, profile: ModelProfile) -> dict[str, Any] | None:
    """The structured final answer as ``response_format``, where the profile supports it."""
    if spec.output_schema is None or not profile.json_schema:
        return None
    return output_mod.response_format(spec.output_schema)


def _helper_request(
    spec: AgentSpec,
    profile: ModelProfile,
    messages: Sequence[Message],
    last_result: dict[str, Any] | None,
) -> RequestPlan:
    """SPEC H-1..H-3: one call; the thread's previous result of the kind as context (H-1);
    ``response_format`` json_schema for extract where the profile supports it (H-2)."""
    history, question = split_question(model_view(messages))
    built = kinds.helper_request(
        spec,
        question=question,
        history=history,
        json_schema=profile.json_schema,
        last_result=last_result,
    )
    trimmed = trim_history(
        built.messages, request_budget(profile.context_window, profile.max_tokens)
    )
    return RequestPlan(
        messages=tuple(trimmed),
        max_tokens=profile.max_tokens,
        response_format=built.response_format,
    )
