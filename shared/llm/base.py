"""The model seam: a ``ChatModel`` turns a ``ModelRequest`` into one assembled ``Reply``.

Deltas are reported to ``on_delta`` while the reply streams, so callers can publish them live.
``abort`` (``shared.llm.abort``) stops the call from outside: at the run's deadline, or when
the caller cancels it; the call then raises ``shared.errors.Aborted``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from shared.agent.messages import Message, Reply

if TYPE_CHECKING:
    from shared.llm.abort import Abort

__all__ = ["ChatModel", "Delta", "DeltaSink", "ModelRequest", "ToolDef"]


@dataclass(frozen=True, slots=True)
class ToolDef:
    """A tool as the model sees it."""

    name: str
    description: str
    parameters: dict[str, Any]

    def to_wire(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


@dataclass(frozen=True, slots=True)
class ModelRequest:
    messages: tuple[Message, ...]
    tools: tuple[ToolDef, ...] = ()
    tool_choice: str | None = None  # None = provider default ("auto"); "none" forces an answer
    max_tokens: int | None = None
    response_format: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Delta:
    """A piece of a streaming reply: answer text, reasoning, or tool-call progress."""

    kind: Literal["text", "reasoning", "tool"]
    text: str = ""
    index: int | None = None  # tool-call index
    name: str | None = None  # tool name, once known


DeltaSink = Callable[[Delta], None]


class ChatModel(Protocol):
    """Anything that can answer a chat request."""

    def complete(
        self,
        request: ModelRequest,
        on_delta: DeltaSink | None = None,
        abort: Abort | None = None,
    ) -> Reply: ...
