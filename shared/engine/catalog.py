"""The run's tool catalog: registry and inline tools plus the internal tools its flags enable."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared.agent import ask as ask_mod
from shared.agent import plan as plan_mod
from shared.agent.attachments import is_image
from shared.agent.spec import AgentSpec, InlineTool, ModelProfile
from shared.agent.state import CatalogEntry
from shared.agent.step import INTERNAL_TOOLS
from shared.tools import Tool, resolve
from shared.tools.agent_tool import AgentTool, SubAgentTool
from shared.tools.files import READ_FILES, describe_files
from shared.tools.knowledge import KnowledgeTool

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


def build_catalog(
    spec: AgentSpec,
    profiles: Mapping[str, ModelProfile] | None = None,
    *,
    attachments: Sequence[Mapping[str, Any]] = (),
) -> Catalog:
    """SPEC P-5: a business tool named like an internal one is dropped, with a warning.
    Inline tools with ``agent:`` become ``AgentTool``s (a chat or helper agent: one call;
    model profiles by name: ``profiles``) or ``SubAgentTool``s (a tool agent: a child run,
    whose own catalog is checked here too); ``knowledge:`` makes a ``KnowledgeTool``.
    A tool that cannot run here (``unavailable``: run_python without bubblewrap) is left
    out, with a warning. A run with documents among its ``attachments`` gets ``read_files``
    (SPEC M-11)."""
    if spec.kind != "agent":
        return Catalog(entries={}, tools={})
    entries: dict[str, CatalogEntry] = {}
    tools: dict[str, Tool] = {}
    warnings: list[str] = []
    internal = {e.name: e for e in _internal_entries(spec)}
    for tool in resolve(spec.tools, lambda item: _inline_tool(item, spec, profiles)):
        if tool.name == "stop" and getattr(tool, "internal", False):
            entries["stop"] = _STOP
        elif tool.name in _RESERVED:
            warnings.append(f"tool {tool.name!r} has an internal tool's name and was removed")
        elif reason := _unavailable(tool):
            warnings.append(f"tool {tool.name!r} is unavailable and was removed: {reason}")
        else:
            entries[tool.name] = CatalogEntry(
                name=tool.name, description=tool.description, parameters=tool.parameters,
                read_only=tool.read_only, internal=False,
            )
            tools[tool.name] = tool
    entries.update(internal)
    docs = [a for a in attachments if not is_image(a)]  # images go to the model directly
    if docs:
        entries[READ_FILES.name] = _read_files_entry(docs)
        tools[READ_FILES.name] = READ_FILES
    return Catalog(entries=entries, tools=tools, warnings=tuple(warnings))


def _inline_tool(
    item: InlineTool, spec: AgentSpec, profiles: Mapping[str, ModelProfile] | None
) -> Tool:
    """The engine-made inline tools: knowledge search, tool agent (child run), one-call agent."""
    if item.knowledge is not None:
        return KnowledgeTool(item, spec.model, profiles)
    if item.sub_agent is not None:
        build_catalog(item.sub_agent, profiles)  # unknown tools of the child: an error now
        return SubAgentTool(item)
    return AgentTool(item, profiles)


def _unavailable(tool: Tool) -> str | None:
    """Why ``tool`` cannot run in this process (its optional ``unavailable`` property)."""
    reason = getattr(tool, "unavailable", None)
    return str(reason) if reason else None


def _read_files_entry(attachments: Sequence[Mapping[str, Any]]) -> CatalogEntry:
    """``read_files``, its description naming the run's files (an external, read-only call)."""
    return CatalogEntry(
        name=READ_FILES.name,
        description=f"{READ_FILES.description}\n{describe_files(attachments)}",
        parameters=READ_FILES.parameters, read_only=True, internal=False,
    )

