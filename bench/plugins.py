"""Tools for the benchmarks, loaded in worker processes with ``TREADLE_PLUGINS=bench.plugins``."""

from __future__ import annotations

from pydantic import BaseModel

from shared.tools import ToolContext, ToolResult, tool


class EchoArgs(BaseModel):
    text: str


@tool(read_only=True, quick=True)
def bench_echo(args: EchoArgs, ctx: ToolContext) -> ToolResult:
    """Return the text (an instant, side-effect-free tool)."""
    return ToolResult(text=args.text)
