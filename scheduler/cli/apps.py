"""What every ``treadle`` command shares: the form of a command group, and where commands
print (stdout; stderr for prompts while stdout is the JSON a script reads)."""

from __future__ import annotations

import typer
from rich.console import Console

__all__ = ["command_group", "console", "err_console"]

console = Console()
err_console = Console(stderr=True)


def command_group(help_text: str) -> typer.Typer:
    """A command group: its help when called without a command, no completion commands."""
    return typer.Typer(help=help_text, no_args_is_help=True, add_completion=False)
