"""Plugin guardrails (docs/guardrails.md): registered Python functions that check a text, as
router handlers are registered (``shared.engine.handlers``). A plugin is
``fn(text, stage) -> reason`` to trip the guardrail, or None to let the text pass; ``stage``
is ``input``, ``output`` or ``tool_call``."""

from __future__ import annotations

import threading
from collections.abc import Callable

from shared.agent.spec import AgentSpec
from shared.errors import SpecError

__all__ = ["Plugin", "check_plugins", "guardrail", "plugin_names", "run_plugin"]

Plugin = Callable[[str, str], str | None]
"""``fn(text, stage) -> reason`` to trip, or None to pass."""
_plugins: dict[str, Plugin] = {}
_lock = threading.Lock()


def guardrail(name: str) -> Callable[[Plugin], Plugin]:
    """Register a plugin guardrail ``fn(text, stage) -> reason | None`` under ``name``."""

    def register(fn: Plugin) -> Plugin:
        with _lock:
            _plugins[name] = fn
        return fn

    return register


def plugin_names() -> list[str]:
    with _lock:
        return sorted(_plugins)


def check_plugins(spec: AgentSpec) -> None:
    """SpecError (422) for a guardrail naming a plugin this process has not registered (it
    would fail the run's first round): refused at submit."""
    known = set(plugin_names())
    for stage, guards in (("input", spec.input_guardrails), ("output", spec.output_guardrails)):
        for g in guards:
            if g.plugin is not None and g.plugin not in known:
                raise SpecError(
                    f"{stage}_guardrails[{g.name}].plugin: unknown guardrail plugin "
                    f"{g.plugin!r}; known: {', '.join(sorted(known)) or 'none'}"
                )


def run_plugin(name: str, text: str, stage: str) -> str | None:
    """The plugin's verdict on ``text``: a reason to trip, or None."""
    with _lock:
        fn = _plugins.get(name)
    if fn is None:
        raise SpecError(f"unknown guardrail plugin {name!r}")
    return fn(text, stage)
