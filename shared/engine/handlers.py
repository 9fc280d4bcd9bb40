"""Local intent handlers for router rules (SPEC N-1): registered Python functions that answer
a routed input without a model call."""

from __future__ import annotations

import threading
from collections.abc import Callable

from shared.errors import SpecError

__all__ = ["handler", "handler_names", "run_handler"]

Handler = Callable[[str], str]
_handlers: dict[str, Handler] = {}
_lock = threading.Lock()


def handler(name: str) -> Callable[[Handler], Handler]:
    """Register ``fn(text) -> answer`` under ``name``."""

    def register(fn: Handler) -> Handler:
        with _lock:
            _handlers[name] = fn
        return fn

    return register


def handler_names() -> list[str]:
    with _lock:
        return sorted(_handlers)


def run_handler(name: str, text: str) -> str:
    with _lock:
        fn = _handlers.get(name)
    if fn is None:
        raise SpecError(f"unknown router handler {name!r}; known: {', '.join(handler_names())}")
    return fn(text)


@handler("resolve_conflicts")
def _resolve_conflicts(text: str) -> str:
    """The classic local intent: merge conflicts are handled by a fixed procedure."""
    return (
        "Handled locally (no model call): to resolve merge conflicts, run `git status` to list "
        "the conflicted files, edit each to keep the right side of every <<<<<<< / >>>>>>> "
        "block, `git add` them and `git commit`."
    )


@handler("echo")
def _echo(text: str) -> str:
    return f"Routed locally: {text}"
