"""Messages, tool calls and model replies: the values the loop passes around.

Wire form (``to_wire``) uses the OpenAI lowercase keys (SPEC M-5); storage form
(``to_dict``/``from_dict``) keeps every field.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

__all__ = ["Message", "Reply", "Role", "ToolCall", "Usage", "content_text"]

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call the model made. ``arguments`` is the raw JSON text as streamed."""

    id: str
    name: str
    arguments: str = "{}"

    def to_dict(self) -> dict[str, str]:
        return {"id": self.id, "name": self.name, "arguments": self.arguments}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ToolCall:
        return cls(id=str(d["id"]), name=str(d["name"]), arguments=str(d.get("arguments") or "{}"))

    def to_wire(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True, slots=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    estimated: bool = False
    reasoning_tokens: int = 0  # of the output tokens, those spent reasoning

    def to_dict(self) -> dict[str, Any]:
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cached_input_tokens": self.cached_input_tokens,
            "reasoning_tokens": self.reasoning_tokens,
            "estimated": self.estimated,
        }


def _blank(content: Any) -> bool:
    if content is None:
        return True
    if isinstance(content, str):
        return not content.strip()
    return all(
        p.get("type") == "text" and not str(p.get("text", "")).strip()
        for p in content
        if isinstance(p, dict)
    )


@dataclass(frozen=True, slots=True)
class Message:
    """A transcript message. ``content`` is text, or a list of OpenAI content parts (vision)."""

    role: Role
    content: str | list[dict[str, Any]] | None = ""
    reasoning: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    hidden: bool = False
    kind: str | None = None  # e.g. "context_checkpoint", "history"

    @property
    def text(self) -> str:
        """The textual content (text parts joined for a parts list)."""
        if isinstance(self.content, str):
            return self.content
        if not self.content:
            return ""
        return "".join(str(p.get("text", "")) for p in self.content if p.get("type") == "text")

    @property
    def droppable(self) -> bool:
        """SPEC M-5: a user or assistant turn with blank content and no tool calls is never
        sent to a model."""
        return self.role in ("user", "assistant") and not self.tool_calls and _blank(self.content)

    def with_content(self, content: str | list[dict[str, Any]]) -> Message:
        return replace(self, content=content)

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [c.to_wire() for c in self.tool_calls]
            if not self.content:
                out["content"] = None
        if self.role == "tool":
            out["tool_call_id"] = self.tool_call_id
            if self.content in (None, ""):
                out["content"] = "(empty)"
        if self.name and self.role != "tool":
            out["name"] = self.name
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "content": self.content,
            "reasoning": self.reasoning,
            "tool_calls": [c.to_dict() for c in self.tool_calls],
            "tool_call_id": self.tool_call_id,
            "name": self.name,
            "hidden": self.hidden,
            "kind": self.kind,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Message:
        return cls(
            role=d["role"],
            content=d.get("content"),
            reasoning=d.get("reasoning") or "",
            tool_calls=tuple(ToolCall.from_dict(c) for c in d.get("tool_calls") or ()),
            tool_call_id=d.get("tool_call_id"),
            name=d.get("name"),
            hidden=bool(d.get("hidden", False)),
            kind=d.get("kind"),
        )


@dataclass(frozen=True, slots=True)
class Reply:
    """One assembled model reply (the whole stream)."""

    text: str = ""
    reasoning: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str | None = None
    usage: Usage | None = None
    raw_model: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_message(self) -> Message:
        return Message(
            role="assistant",
            content=self.text,
            reasoning=self.reasoning,
            tool_calls=self.tool_calls,
        )


def content_text(content: Any) -> str:
    """The text of a message's wire ``content``: the string, or its parts' ``text`` joined
    (an image part, or anything else, gives none)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""
