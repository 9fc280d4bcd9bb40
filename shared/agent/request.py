"""What to send the model this round (pure): messages, tools, tool_choice.

The model view starts at the last context checkpoint (L-8) and is trimmed to the window
(C-3); ``tool_choice`` comes from the anti-loop counters (L-3).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from shared.agent import chat, kinds
from shared.agent.attachments import READ_FILES, with_attachments
from shared.agent.compression import model_view
from shared.agent.history import request_budget, trim_history
from shared.agent.messages import Message
from shared.agent.plan import PLANNING_SYSTEM_PROMPT
from shared.agent.spec import AgentSpec, ModelProfile
from shared.agent.state import CatalogEntry, LoopState
from shared.agent.step import next_tool_choice

__all__ = ["RequestPlan", "plan_request", "split_question"]


@dataclass(frozen=True, slots=True)
class RequestPlan:
    messages: tuple[Message, ...]
    tools: tuple[CatalogEntry, ...] = ()
    tool_choice: str | None = None
    max_tokens: int | None = None
    response_format: dict[str, Any] | None = None


def split_question(messages: Sequence[Message]) -> tuple[list[Message], str]:
    """The history before the last user message, and that message's text."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].role == "user":
            return list(messages[:i]), messages[i].text
    return list(messages), ""


def _agent_messages(
    spec: AgentSpec, profile: ModelProfile, messages: Sequence[Message]
) -> list[Message]:
    system = chat.join_system_prompt(
        profile.default_system_prompt,
        spec.system_prompt,
        PLANNING_SYSTEM_PROMPT if spec.plan else "",
    )
    view = model_view(messages)
    head = [Message(role="system", content=system)] if system else []
    return trim_history(head + view, request_budget(profile.context_window, profile.max_tokens))


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
) -> RequestPlan:
    """``inputs``: quotes (C-2), last_result (H-1), attachments and, for a vision profile,
    ``images`` (data URLs loaded by the engine) — SPEC M-11, see ``attachments``."""
    if spec.kind == "chat":
        req = RequestPlan(
            tuple(_chat_messages(spec, profile, messages, inputs)), max_tokens=profile.max_tokens
        )
    elif spec.kind in ("classify", "extract", "expand_query"):
        req = _helper_request(spec, profile, messages, inputs.get("last_result"))
    else:
        req = RequestPlan(
            messages=tuple(_agent_messages(spec, profile, messages)),
            tools=tuple(catalog.values()),
            tool_choice=next_tool_choice(spec, state),
            max_tokens=profile.max_tokens,
        )
    msgs = with_attachments(
        req.messages, inputs, vision=profile.vision, readable=READ_FILES in catalog
    )
    return replace(req, messages=tuple(msgs))


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
