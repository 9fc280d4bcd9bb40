"""Interactive pickers for a terminal: one choice from a list (with free text), and a
checklist. Arrow keys (or j/k), digits, space, enter; no dependency beyond rich.

Without a terminal on stdin (a pipe, a script) they fall back to numbered prompts read line
by line, so ``echo 2 | treadle answer RUN`` works too.
"""

from __future__ import annotations

import os
import select
import sys
import termios
import tty
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.text import Text

__all__ = ["Choice", "checklist", "choose", "interactive_terminal"]

UP, DOWN, ENTER, SPACE = "up", "down", "enter", "space"
_FULL_LINES = 14
_KEYS = {
    "\x1b[A": UP,
    "\x1bOA": UP,
    "k": UP,
    "\x1b[B": DOWN,
    "\x1bOB": DOWN,
    "j": DOWN,
    "\r": ENTER,
    "\n": ENTER,
    " ": SPACE,
}


@dataclass(frozen=True, slots=True)
class Choice:
    label: str
    value: str
    detail: str = ""  # one line beside the label
    full: str = ""  # shown below the list while the cursor is on this choice


def interactive_terminal() -> bool:
    """True when a person can answer: stdin and stdout are both terminals."""
    return sys.stdin.isatty() and sys.stdout.isatty()


@contextmanager
def _cbreak() -> Iterator[int]:
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield fd
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _read_key(fd: int) -> str:
    ch = os.read(fd, 1).decode(errors="replace")
    if ch == "\x03":
        raise KeyboardInterrupt
    if ch != "\x1b":
        return _KEYS.get(ch, ch)
    seq = ch
    while select.select([fd], [], [], 0.05)[0] and len(seq) < 6:
        seq += os.read(fd, 1).decode(errors="replace")
        if seq[-1].isalpha() or seq[-1] == "~":
            break
    return _KEYS.get(seq, "")


def _menu(
    title: str, choices: Sequence[Choice], cursor: int, marks: Sequence[bool] | None, hint: str
) -> RenderableType:
    lines: list[RenderableType] = [Text(title, style="bold")]
    for i, choice in enumerate(choices):
        here = i == cursor
        box = "" if marks is None else ("[x] " if marks[i] else "[ ] ")
        line = Text.assemble(
            ("❯ " if here else "  ", "cyan"),
            (f"{i + 1}. ", "dim"),
            (box, "green" if marks and marks[i] else "dim"),
            (choice.label, "bold cyan" if here else ""),
        )
        if choice.detail:
            line.append(f"  {choice.detail}", style="dim")
        line.no_wrap, line.overflow = True, "ellipsis"
        lines.append(line)
    lines.append(Text(hint, style="dim"))
    if 0 <= cursor < len(choices) and choices[cursor].full:
        full = choices[cursor].full.splitlines()
        more = [f"… {len(full) - _FULL_LINES} more lines"] if len(full) > _FULL_LINES else []
        lines.append(Text("\n".join(["", *full[:_FULL_LINES], *more]), style="dim"))
    return Group(*lines)


def _run_menu(
    console: Console, render: Callable[[], RenderableType], on_key: Callable[[str], bool]
) -> None:
    """Redraw after each key until ``on_key`` returns True (done)."""
    with (
        _cbreak() as fd,
        Live(render(), console=console, auto_refresh=False, transient=True) as live,
    ):
        while True:
            if on_key(_read_key(fd)):
                return
            live.update(render(), refresh=True)


def choose(
    console: Console, title: str, choices: Sequence[Choice], *, other: str | None = None
) -> str:
    """One choice's value; with ``other`` (its label) the user may type an answer instead."""
    items = [*choices, Choice(other, "")] if other else list(choices)
    if not interactive_terminal():
        return _choose_lines(console, title, items, other is not None)
    pos = [0]

    def on_key(key: str) -> bool:
        if key in (UP, DOWN):
            pos[0] = (pos[0] + (1 if key == DOWN else -1)) % len(items)
        elif key.isdigit() and 1 <= int(key) <= len(items):
            pos[0] = int(key) - 1
            return True
        return key == ENTER

    hint = "↑/↓ move · enter pick · 1-9 pick now"
    _run_menu(console, lambda: _menu(title, items, pos[0], None, hint), on_key)
    picked = items[pos[0]]
    if other and pos[0] == len(items) - 1:
        return console.input(f"[bold]{title}[/] [dim](your answer)[/] ").strip()
    console.print(Text.assemble((f"{title} ", "bold"), (picked.label, "cyan")))
    return picked.value


def _choose_lines(console: Console, title: str, items: Sequence[Choice], free: bool) -> str:
    console.print(
        _menu(title, items, -1, None, "type a number" + (" or an answer" if free else ""))
    )
    while True:
        line = sys.stdin.readline()
        if not line:
            raise EOFError("no answer on stdin")
        text = line.strip()
        if text.isdigit() and 1 <= int(text) <= len(items):
            if free and int(text) == len(items):
                continue  # "other": the next line is the answer
            return items[int(text) - 1].value
        if free and text:
            return text


def free_text(console: Console, prompt: str) -> str:
    """A line of text (stripped); empty when the person just presses enter, or stdin ends."""
    if interactive_terminal():
        return console.input(f"[bold]{prompt}[/] ").strip()
    console.print(Text(prompt, style="bold"))
    return sys.stdin.readline().strip()


def checklist(
    console: Console, title: str, choices: Sequence[Choice], checked: bool = True
) -> list[bool]:
    """Which choices are ticked (all start ``checked``)."""
    marks = [checked] * len(choices)
    if not interactive_terminal():
        return _checklist_lines(console, title, choices, marks)
    pos = [0]

    def on_key(key: str) -> bool:
        if key in (UP, DOWN):
            pos[0] = (pos[0] + (1 if key == DOWN else -1)) % len(choices)
        elif key == SPACE:
            marks[pos[0]] = not marks[pos[0]]
        elif key.isdigit() and 1 <= int(key) <= len(choices):
            marks[int(key) - 1] = not marks[int(key) - 1]
        elif key in ("a", "n"):
            marks[:] = [key == "a"] * len(choices)
        return key == ENTER

    hint = "↑/↓ move · space toggle · a all · n none · enter confirm"
    _run_menu(console, lambda: _menu(title, choices, pos[0], marks, hint), on_key)
    return marks


def _checklist_lines(
    console: Console, title: str, choices: Sequence[Choice], marks: list[bool]
) -> list[bool]:
    console.print(
        _menu(
            title,
            choices,
            -1,
            marks,
            "enter keeps all ticked; or type the numbers to keep (e.g. 1 3), or 'none'",
        )
    )
    line = sys.stdin.readline().strip().lower()
    if not line:
        return marks
    if line == "none":
        return [False] * len(choices)
    keep = {int(p) for p in line.replace(",", " ").split() if p.isdigit()}
    return [i + 1 in keep for i in range(len(choices))]
