"""Registered agents: a run may name one instead of sending a spec (``agent: "demo"``).

Built-ins below, plus a YAML/JSON file named by ``TREADLE_AGENTS_FILE`` (``name: spec``).
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from shared.agent.spec import AgentSpec, InlineTool
from shared.errors import NotFound, SpecError

__all__ = ["BUILTIN_AGENTS", "agent_names", "load_agent_file", "resolve_agent"]

BUILTIN_AGENTS: dict[str, dict[str, Any]] = {
    "demo": {
        "kind": "agent",
        "model": "demo",
        "system_prompt": "You are treadle's demo agent. Use tools for facts; then answer briefly.",
        "tools": ["current_time", "calculator"],
    },
    "demo-chat": {"kind": "chat", "model": "demo", "system_prompt": "You are a helpful assistant."},
    "demo-planner": {
        "kind": "agent",
        "model": "demo",
        "plan": True,
        "ask": True,
        "tools": ["current_time", "calculator"],
    },
}


def load_agent_file(path: str) -> dict[str, dict[str, Any]]:
    text = Path(path).read_text(encoding="utf-8")
    data = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping of agent name to spec")
    return {str(k): dict(v) for k, v in data.items()}


@lru_cache(maxsize=1)
def _registered() -> dict[str, dict[str, Any]]:
    out = dict(BUILTIN_AGENTS)
    path = os.environ.get("TREADLE_AGENTS_FILE")
    if path:
        out.update(load_agent_file(path))
    return out


def agent_names() -> list[str]:
    return sorted(_registered())


def resolve_agent(agent: AgentSpec | str) -> AgentSpec:
    """A spec, or a registered agent by name. Agent tools naming a registered agent get its
    spec now: the run stores a self-contained spec (workers do not read the agents file)."""
    if isinstance(agent, AgentSpec):
        return _resolve_tool_agents(agent)
    spec = _registered().get(agent)
    if spec is None:
        raise NotFound(f"no registered agent named {agent!r}; known: {', '.join(agent_names())}")
    return _resolve_tool_agents(AgentSpec.model_validate(spec))


def _resolve_tool_agents(spec: AgentSpec) -> AgentSpec:
    if not any(isinstance(t, InlineTool) and isinstance(t.agent, str) for t in spec.tools):
        return spec
    tools: list[str | InlineTool] = []
    for tool in spec.tools:
        if isinstance(tool, InlineTool) and isinstance(tool.agent, str):
            tool = tool.model_copy(update={"agent": _tool_agent(tool.name, tool.agent)})
        tools.append(tool)
    return spec.model_copy(update={"tools": tools})


def _tool_agent(tool: str, name: str) -> AgentSpec:
    raw = _registered().get(name)
    if raw is None:
        raise SpecError(f"tool {tool!r}: no registered agent named {name!r}; "
                        f"known: {', '.join(agent_names())}")
    sub = AgentSpec.model_validate(raw)
    if sub.kind == "agent":
        raise SpecError(f"tool {tool!r}: agent {name!r} is a tool agent; an agent tool must be "
                        "a chat or helper agent (one model call)")
    return sub
