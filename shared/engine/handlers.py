"""Local intent handlers for router rules (SPEC N-1): registered Python functions that answer
a routed input without a model call."""

from __future__ import annotations

import threading
from collections.abc import Callable

from shared.agent.spec import AgentSpec
from shared.errors import SpecError

__all__ = ["check_router", "handler", "handler_names", "run_handler"]

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


def check_router(spec: AgentSpec) -> None:
    """SpecError for a router rule naming a handler this process has not registered (N-1):
    a spec that would fail its first round is refused when it is submitted."""
    known = set(handler_names())
    for i, rule in enumerate(spec.router):
        if rule.handler and not rule.pass_to_model and rule.handler not in known:
            raise SpecError(
                f"router[{i}].handler: unknown handler {rule.handler!r}; "
                f"known: {', '.join(sorted(known)) or 'none'}"
            )


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
