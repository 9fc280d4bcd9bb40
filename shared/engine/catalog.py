"""The run's tool catalog: registry and inline tools plus the internal tools its flags enable."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from shared.agent import ask as ask_mod
from shared.agent import plan as plan_mod
from shared.agent.spec import AgentSpec, ModelProfile
from shared.agent.state import CatalogEntry
from shared.agent.step import INTERNAL_TOOLS
from shared.tools import Tool, resolve
from shared.tools.agent_tool import AgentTool

__all__ = ["Catalog", "build_catalog"]

_STOP = CatalogEntry(
    name="stop",
    description="End the run now, without another model call.",
    parameters={"type": "object", "properties": {"reason": {"type": "string"}}},
    read_only=True,
    internal=True,
)


_RESERVED = INTERNAL_TOOLS | {"read_files"}


@dataclass(frozen=True)
class Catalog:
    entries: dict[str, CatalogEntry]
    tools: dict[str, Tool]  # executables for external entries
    warnings: tuple[str, ...] = ()


def _internal_entries(spec: AgentSpec) -> list[CatalogEntry]:
    out = []
    if spec.plan:
        out += [CatalogEntry(name=d["name"], description=d["description"],
                             parameters=d["parameters"], read_only=True, internal=True)
                for d in plan_mod.TOOL_DEFS]
    if spec.ask:
        d = ask_mod.TOOL_DEF
        out.append(CatalogEntry(name=d["name"], description=d["description"],
                                parameters=d["parameters"], read_only=True, internal=True))
    return out


def build_catalog(spec: AgentSpec, profiles: Mapping[str, ModelProfile] | None = None) -> Catalog:
    """SPEC P-5: a business tool named like an internal one is dropped, with a warning.
    Inline tools with ``agent:`` become ``AgentTool``s (model profiles by name: ``profiles``)."""
    if spec.kind != "agent":
        return Catalog(entries={}, tools={})
    entries: dict[str, CatalogEntry] = {}
    tools: dict[str, Tool] = {}
    warnings: list[str] = []
    internal = {e.name: e for e in _internal_entries(spec)}
    for tool in resolve(spec.tools, lambda item: AgentTool(item, profiles)):
        if tool.name == "stop" and getattr(tool, "internal", False):
            entries["stop"] = _STOP
        elif tool.name in _RESERVED:
            warnings.append(f"tool {tool.name!r} has an internal tool's name and was removed")
        else:
            entries[tool.name] = CatalogEntry(
                name=tool.name, description=tool.description, parameters=tool.parameters,
                read_only=tool.read_only, internal=False,
            )
            tools[tool.name] = tool
    entries.update(internal)
    return Catalog(entries=entries, tools=tools, warnings=tuple(warnings))

