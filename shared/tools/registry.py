"""The tool registry: filled by ``@tool`` and by the ``treadle.tools`` entry-point group.

An entry point names a ``Tool``, or a callable (a class or a factory) returning one tool or an
iterable of tools. Entry points are loaded once per registry, on first lookup or explicitly.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from importlib import metadata
from typing import Any

from pydantic import BaseModel

from shared.agent.spec import InlineTool
from shared.errors import SpecError
from shared.llm.base import ToolDef
from shared.tools.base import FunctionTool, Tool, ToolFunction
from shared.tools.http_tool import HttpTool

__all__ = [
    "ENTRY_POINT_GROUP",
    "AgentToolFactory",
    "REGISTRY",
    "Registry",
    "get",
    "load_entry_points",
    "resolve",
    "tool",
    "tool_defs",
]

ENTRY_POINT_GROUP = "treadle.tools"
AgentToolFactory = Callable[[InlineTool], Tool]
"""Makes the tool for an inline tool with ``agent:`` (an agent as a tool) or ``knowledge:``
(a dataset search): tools the engine builds, with what it knows (profiles, the agent)."""
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
log = logging.getLogger(__name__)


class Registry:
    """Tools by name. Thread-safe; ``group`` None turns entry-point loading off."""

    def __init__(self, group: str | None = ENTRY_POINT_GROUP) -> None:
        self._group = group
        self._tools: dict[str, Tool] = {}
        self._lock = threading.RLock()  # re-entrant: a plugin's import may call @tool
        self._plugins_loaded = group is None

    def add(self, item: Tool) -> Tool:
        """Register ``item``; the same object twice is a no-op, another with its name an error."""
        if not _NAME.match(item.name):
            raise ValueError(f"invalid tool name {item.name!r}: use 1-64 of [A-Za-z0-9_-]")
        with self._lock:
            known = self._tools.get(item.name)
            if known is not None and known is not item:
                raise ValueError(f"a tool named {item.name!r} is already registered")
            self._tools[item.name] = item
        return item

    def get(self, name: str) -> Tool:
        """The tool called ``name``; KeyError when there is none."""
        self.load_entry_points()
        with self._lock:
            return self._tools[name]

    def names(self) -> list[str]:
        self.load_entry_points()
        with self._lock:
            return sorted(self._tools)

    def load_entry_points(self) -> list[str]:
        """Load the entry-point group once; returns the names added by this call."""
        with self._lock:
            if self._plugins_loaded or self._group is None:
                return []
            self._plugins_loaded = True
            found = metadata.entry_points(group=self._group)
            return [t.name for ep in found for t in self._load(ep)]

    def _load(self, ep: metadata.EntryPoint) -> list[Tool]:
        try:
            found = _as_tools(ep.load())
        except Exception:
            log.exception("tool entry point %r (%s) failed to load", ep.name, ep.value)
            return []
        added = []
        for item in found:
            try:
                added.append(self.add(item))
            except ValueError as exc:
                log.warning("tool entry point %r skipped: %s", ep.name, exc)
        return added

    def resolve(
        self, spec_tools: Sequence[str | InlineTool], agent_tool: AgentToolFactory | None = None
    ) -> list[Tool]:
        """An agent spec's ``tools`` as tools: registry names, inline HTTP tools, and inline
        agent and knowledge tools (``agent:``, ``knowledge:``) made by ``agent_tool`` (the
        engine supplies it)."""
        tools = [self._resolve_one(item, agent_tool) for item in spec_tools]
        names = [t.name for t in tools]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise SpecError(f"duplicate tool names: {', '.join(dupes)}")
        return tools

    def _resolve_one(self, item: str | InlineTool, agent_tool: AgentToolFactory | None) -> Tool:
        if isinstance(item, InlineTool):
            if (item.agent is not None or item.knowledge is not None) and agent_tool is not None:
                return agent_tool(item)
            if item.http is None:
                raise SpecError(f"inline tool {item.name!r} has no `http` section")
            return HttpTool(item)
        try:
            return self.get(item)
        except KeyError:
            known = ", ".join(self.names()) or "(none)"
            raise SpecError(f"unknown tool {item!r}; known tools: {known}") from None


def _as_tools(obj: object) -> list[Tool]:
    """An entry point's object as tools: a Tool, or a callable returning a Tool or Tools."""
    if isinstance(obj, Tool) and not isinstance(obj, type):
        return [obj]
    if not callable(obj):
        raise TypeError(f"{obj!r} is neither a Tool nor a callable returning tools")
    made = obj()
    if isinstance(made, Tool):
        return [made]
    items = list(made) if isinstance(made, Iterable) and not isinstance(made, str) else None
    if items is not None and all(isinstance(t, Tool) for t in items):
        return items
    raise TypeError(f"{obj!r} returned {made!r}, not a Tool or Tools")


REGISTRY = Registry()


def tool(
    name: str | None = None,
    *,
    description: str | None = None,
    read_only: bool = False,
    internal: bool = False,
    quick: bool = False,
    args_model: type[BaseModel] | None = None,
    registry: Registry | None = None,
) -> Callable[[ToolFunction[Any]], FunctionTool[Any]]:
    """Make ``fn(args: Model, ctx)`` a ``FunctionTool`` and register it (global registry).
    ``quick``: a read-only tool that runs in-process in well under a second, without I/O."""

    def wrap(fn: ToolFunction[Any]) -> FunctionTool[Any]:
        made = FunctionTool.from_function(
            fn,
            name=name,
            description=description,
            read_only=read_only,
            internal=internal,
            quick=quick,
            args_model=args_model,
        )
        (registry or REGISTRY).add(made)
        return made

    return wrap


def get(name: str) -> Tool:
    return REGISTRY.get(name)


def load_entry_points() -> list[str]:
    return REGISTRY.load_entry_points()


def resolve(
    spec_tools: Sequence[str | InlineTool], agent_tool: AgentToolFactory | None = None
) -> list[Tool]:
    return REGISTRY.resolve(spec_tools, agent_tool)


def tool_defs(tools: Iterable[Tool]) -> list[ToolDef]:
    """The tools as the model sees them."""
    return [ToolDef(name=t.name, description=t.description, parameters=t.parameters) for t in tools]
