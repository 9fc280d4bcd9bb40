"""``save_note``: a harmless write tool for demos of guarded agents (approvals).

It is a *write* (``read_only=False``), so a guarded agent must get a person's approval before
it runs; what it writes is only its own result: nothing outside the run changes.
"""

from __future__ import annotations

import hashlib

from pydantic import BaseModel, Field

from shared.tools.base import ToolContext, ToolResult
from shared.tools.registry import tool

__all__ = ["SaveNoteArgs", "save_note"]


class SaveNoteArgs(BaseModel):
    title: str = Field(min_length=1, max_length=200, description="A short title for the note.")
    text: str = Field(min_length=1, max_length=20_000, description="The note itself.")


@tool(read_only=False)
def save_note(args: SaveNoteArgs, ctx: ToolContext) -> ToolResult:
    """Save a note for the user (a write: guarded agents ask for approval first)."""
    note_id = "note_" + hashlib.sha256(ctx.idempotency_key.encode()).hexdigest()[:12]
    text = f"Saved note {args.title!r} ({len(args.text)} characters) as {note_id}."
    return ToolResult(text=text, data={"id": note_id, "title": args.title, "chars": len(args.text)})
