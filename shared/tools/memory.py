"""``remember`` and ``recall``: an agent's long-term memory as tools (docs/memory.md).

An agent lists them in ``tools``; its ``memory.namespace`` template (default
``["memories", "{user_id}"]``, filled from the run's metadata) says whose memory they read and
write, so a fact remembered in one thread is recalled in another thread of the same user and
never in another user's. ``remember`` is a write (a guarded agent asks first); ``recall`` a
read. Both go through ``ToolContext.memory`` (the engine's ``RunMemory``).
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from shared.errors import ToolError
from shared.tools.base import MemorySource, ToolContext, ToolResult
from shared.tools.registry import tool

__all__ = ["RecallArgs", "RememberArgs", "recall", "remember"]


def _memory(ctx: ToolContext) -> MemorySource:
    if ctx.memory is None:
        raise ToolError("long-term memory is not available here")
    return ctx.memory


class RememberArgs(BaseModel):
    fact: str = Field(
        min_length=1,
        max_length=4000,
        description="What to remember: one self-contained statement (who, what, which).",
    )
    key: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="A short name for it; remembering under the same key replaces the old fact.",
    )


@tool(read_only=False)
def remember(args: RememberArgs, ctx: ToolContext) -> ToolResult:
    """Remember a fact for later conversations with this user (long-term memory)."""
    saved = _memory(ctx).remember(args.key, {"text": args.fact})
    return ToolResult(text=f"Remembered (key {saved['key']}).", data=saved)


class RecallArgs(BaseModel):
    query: str = Field(
        min_length=1, max_length=1000, description="What to look for: a question or keywords."
    )
    k: int = Field(default=5, ge=1, le=20, description="How many facts, at most.")


@tool(read_only=True)
def recall(args: RecallArgs, ctx: ToolContext) -> ToolResult:
    """Recall facts remembered in earlier conversations with this user (long-term memory)."""
    found = _memory(ctx).recall(args.query, args.k)
    if not found:
        return ToolResult(text="Nothing remembered about that.", data={"items": []})
    lines = [f"{i}. {_text(f['value'])}" for i, f in enumerate(found, start=1)]
    return ToolResult(text="Remembered facts:\n" + "\n".join(lines), data={"items": found})


def _text(value: object) -> str:
    if isinstance(value, dict) and isinstance(value.get("text"), str):
        return str(value["text"])
    return str(value)
