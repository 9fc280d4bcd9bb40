"""The run's tool catalog: registry and inline tools plus the internal tools its flags enable."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from shared.agent import ask as ask_mod
from shared.agent import plan as plan_mod
from shared.agent.attachments import is_image
from shared.agent.handoff import transfer_entries
from shared.agent.messages import Message
from shared.agent.request import RequestPlan
from shared.agent.spec import AgentSpec, InlineTool, ModelProfile
from shared.agent.state import CatalogEntry
from shared.agent.step import INTERNAL_TOOLS
from shared.engine.guard_plugins import check_plugins
from shared.engine.handlers import check_router
from shared.errors import SpecError, ToolError
from shared.tools import Tool, ToolContext, ToolResult, resolve
from shared.tools.agent_tool import AgentTool, SubAgentTool
from shared.tools.files import READ_FILES, describe_files
from shared.tools.knowledge import KnowledgeTool
from shared.tools.mcp_lists import ToolLists
from shared.tools.mcp_tools import McpAccess, list_mcp_tools

__all__ = ["DEFER_S", "Catalog", "build_catalog", "with_unavailable_note"]

DEFER_S = 1.0

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
    unreachable: dict[str, str] = field(default_factory=dict)  # MCP servers not listed: why
    # an MCP server is still listing and this build did not wait (its tenant's threads
    # already wait): a round gives itself back and comes again in ``DEFER_S``
    deferred: bool = False

    def tool(self, name: str) -> Tool | None:
        """The executable for ``name``; while an MCP server could not be listed, a tool this
        catalog does not know may be one of its tools: its call says so."""
        found = self.tools.get(name)
        if found is None and self.unreachable:
            return _Unlisted(name, dict(self.unreachable))
        return found

    @property
    def partial(self) -> bool:
        """Some MCP server could not be listed (build again later rather than keep this)."""
        return bool(self.unreachable)

    def unavailable_event(self) -> dict[str, Any] | None:
        """The data of the round's ``tool.unavailable`` warning (None: nothing is missing)."""
        if not self.unreachable:
            return None
        servers = [{"server": name, "reason": why[:500]} for name, why in self.unreachable.items()]
        return {"level": "warning", "servers": servers}


def with_unavailable_note(req: RequestPlan, catalog: Catalog) -> RequestPlan:
    """``req`` with a line in its system text that tells the model which MCP servers' tools
    are missing this round (their servers could not be listed): it should not expect them,
    nor make them up."""
    if not catalog.unreachable:
        return req
    names = ", ".join(sorted(catalog.unreachable))
    note = (
        f"Note: the tools of the MCP server(s) {names} are unavailable right now (the server "
        "could not be reached or did not list its tools in time); do not call them."
    )
    msgs = list(req.messages)
    if msgs and msgs[0].role == "system" and isinstance(msgs[0].content, str):
        msgs[0] = msgs[0].with_content(f"{msgs[0].content}\n\n{note}".lstrip())
    else:
        msgs.insert(0, Message(role="system", content=note))
    return replace(req, messages=tuple(msgs))


@dataclass(frozen=True)
class _Unlisted:
    """A call to a tool the catalog lacks while MCP servers are unreachable."""

    name: str
    reasons: dict[str, str]
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    read_only: bool = False
    internal: bool = False

    def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        why = "; ".join(self.reasons.values())
        raise ToolError(f"{self.name} is not available now: {why}")


def _internal_entries(spec: AgentSpec) -> list[CatalogEntry]:
    defs = list(plan_mod.TOOL_DEFS) if spec.plan else []
    if spec.ask:
        defs.append(ask_mod.TOOL_DEF)
    return [
        CatalogEntry(
            name=d["name"],
            description=d["description"],
            parameters=d["parameters"],
            read_only=True,
            internal=True,
        )
        for d in defs
    ]


def build_catalog(
    spec: AgentSpec,
    profiles: Mapping[str, ModelProfile] | None = None,
    *,
    attachments: Sequence[Mapping[str, Any]] = (),
    mcp: McpAccess | None = None,
    mcp_lists: ToolLists | None = None,
) -> Catalog:
    """SPEC P-5: a business tool named like an internal one is dropped, with a warning.
    Inline tools with ``agent:`` become ``AgentTool``s (a chat or helper agent: one call;
    model profiles by name: ``profiles``) or ``SubAgentTool``s (a tool agent: a child run,
    whose own catalog is checked here too); ``knowledge:`` makes a ``KnowledgeTool``.
    A tool that cannot run here (``unavailable``: run_python without bubblewrap) is left
    out, with a warning. A run with documents among its ``attachments`` gets ``read_files``
    (SPEC M-11). The tools of the spec's MCP servers are listed only given ``mcp`` (how to
    reach them: the engine's rounds and tool calls, never a submission; ``mcp_lists``: the
    process's cached lists), as many as the tool limit leaves room for."""
    check_plugins(spec)  # a guardrail naming an unknown plugin: an error now (422)
    if spec.kind != "agent":
        return Catalog(entries={}, tools={})
    check_router(spec)  # a rule naming an unknown handler: an error now, not each round
    internal = {e.name: e for e in _internal_entries(spec)}
    entries, tools, warnings = _spec_tools(spec, profiles)
    unreachable: dict[str, str] = {}
    deferred = False
    if spec.mcp and mcp is not None:
        taken = [*entries, *internal, *_RESERVED]
        room = mcp.max_tools - len(entries)
        listing = list_mcp_tools(spec.mcp, mcp, mcp_lists, taken=taken, room=room)
        for remote in listing.tools:
            entries[remote.name] = _entry(remote)
            tools[remote.name] = remote
        warnings += listing.warnings
        unreachable, deferred = listing.unreachable, listing.deferred
    entries.update(internal)
    _check_handoffs(spec, profiles)
    entries.update({e.name: e for e in transfer_entries(spec)})
    docs = [a for a in attachments if not is_image(a)]  # images go to the model directly
    if docs:
        entries[READ_FILES.name] = _read_files_entry(docs)
        tools[READ_FILES.name] = READ_FILES
    return Catalog(entries, tools, tuple(warnings), unreachable, deferred)


def _spec_tools(
    spec: AgentSpec, profiles: Mapping[str, ModelProfile] | None
) -> tuple[dict[str, CatalogEntry], dict[str, Tool], list[str]]:
    """The spec's own tools: their entries, their executables, and a warning for each one
    left out (an internal tool's name, or unavailable here)."""
    entries: dict[str, CatalogEntry] = {}
    tools: dict[str, Tool] = {}
    warnings: list[str] = []
    for tool in resolve(spec.tools, lambda item: _inline_tool(item, spec, profiles)):
        if tool.name == "stop" and getattr(tool, "internal", False):
            entries["stop"] = _STOP
        elif tool.name in _RESERVED:
            warnings.append(f"tool {tool.name!r} has an internal tool's name and was removed")
        elif reason := _unavailable(tool):
            warnings.append(f"tool {tool.name!r} is unavailable and was removed: {reason}")
        else:
            entries[tool.name] = _entry(tool)
            tools[tool.name] = tool
    return entries, tools, warnings


def _check_handoffs(spec: AgentSpec, profiles: Mapping[str, ModelProfile] | None) -> None:
    """The handoff targets' own tools: an error now, not at the handoff."""
    for h in spec.handoffs:
        if not isinstance(h.agent, AgentSpec):
            raise SpecError(f"handoff {h.name!r}: agent {h.agent!r} is not resolved")
        build_catalog(h.agent, profiles)


def _entry(tool: Tool) -> CatalogEntry:
    return CatalogEntry(
        name=tool.name,
        description=tool.description,
        parameters=tool.parameters,
        read_only=tool.read_only,
        internal=False,
    )


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
        parameters=READ_FILES.parameters,
        read_only=True,
        internal=False,
    )
