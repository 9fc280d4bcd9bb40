"""The one-call helper kinds (SPEC H-1..H-3): their request and their structured result."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shared.agent import helpers
from shared.agent.messages import Message
from shared.agent.spec import AgentSpec

__all__ = ["HelperRequest", "helper_request", "helper_result"]


@dataclass(frozen=True, slots=True)
class HelperRequest:
    messages: list[Message]
    response_format: dict[str, Any] | None = None


def helper_request(
    spec: AgentSpec,
    *,
    question: str,
    history: Sequence[Message],
    json_schema: bool,
    last_result: dict[str, Any] | None = None,
) -> HelperRequest:
    bg = spec.system_prompt
    if spec.kind == "classify":
        prev = (last_result or {}).get("category")
        return HelperRequest(
            helpers.classify_messages(
                question, spec.categories, background=bg, last_result=prev, history=history
            )
        )
    if spec.kind == "extract":
        fmt = helpers.extract_response_format(spec.fields) if json_schema else None
        prev_fields = (last_result or {}).get("fields")
        return HelperRequest(
            helpers.extract_messages(
                question, spec.fields, background=bg, last_result=prev_fields, history=history
            ),
            fmt,
        )
    return HelperRequest(
        helpers.expand_query_messages(question, count=spec.count, history=history, background=bg)
    )


def helper_result(spec: AgentSpec, reply_text: str, question: str) -> dict[str, Any]:
    """Never raises for a bad model answer."""
    if spec.kind == "classify":
        return helpers.classify_result(reply_text, spec.categories)
    if spec.kind == "extract":
        fields, success = helpers.parse_extract(reply_text, spec.fields)
        return {"fields": fields, "success": success}
    return {"queries": helpers.parse_queries(reply_text, question, spec.count, spec.keep)}
