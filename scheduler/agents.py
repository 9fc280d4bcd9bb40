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
from shared.engine.children import MAX_DEPTH
from shared.errors import NotFound, SpecError

__all__ = [
    "BUILTIN_AGENTS",
    "DEMO_ASSISTANT",
    "agent_names",
    "load_agent_file",
    "registered_agents",
    "resolve_agent",
]

def _call(call_id: str, tool: str, **arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "name": tool, "arguments": arguments}


# The interactive demo's script (a scripted model: one fixed reply per round). Round 1 plans
# and asks with options, round 2 proposes a guarded write, rounds 3-4 wrap up and answer.
DEMO_ASSISTANT: list[dict[str, Any]] = [
    {"sleep": 0.3, "reasoning": "The user wants a note saved, but not which kind. I will plan "
     "the work, then ask before writing anything.",
     "tool_calls": [
         _call("call_plan", "set_plan", name="Save a note",
               steps=["Ask which note to save", "Save the note", "Confirm"]),
         _call("call_ask", "ask_user", reason="I need to know what the note should hold.",
               questions=[{"question": "Which note should I save?", "options": [
                   {"label": "Meeting summary", "value": "meeting-summary"},
                   {"label": "Shopping list", "value": "shopping-list"},
                   {"label": "Reminder for tomorrow", "value": "reminder"}]}])]},
    {"sleep": 0.3, "reasoning": "I have the answer. Saving is a write, so it needs approval.",
     "text": "Thanks. I will save the note now; it needs your approval first.",
     "tool_calls": [
         _call("call_plan_2", "update_plan", updates=[{"id": "s1", "status": "done"},
                                                       {"id": "s2", "status": "in_progress"}]),
         _call("call_save", "save_note", title="Note from the treadle demo",
               text="Saved by treadle's interactive demo after your answer and approval.")]},
    {"sleep": 0.2, "reasoning": "The write has its result; closing the plan.",
     "tool_calls": [_call("call_plan_3", "update_plan", updates=[
         {"id": "s2", "status": "done"}, {"id": "s3", "status": "done"}])]},
    {"sleep": 0.2, "reasoning": "Everything is settled; answering.",
     "text": "Done. I asked what to save, proposed the write and went on with your decision; "
     "the save_note result above shows what happened. (This demo model is scripted: its "
     "replies are fixed.)"},
]

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
    "demo-assistant": {
        "kind": "agent",
        "model": {"name": "demo-assistant", "provider": "scripted", "replies": DEMO_ASSISTANT},
        "system_prompt": "You are treadle's demo assistant: you ask, then propose a write.",
        "plan": True,
        "ask": True,
        "guarded": True,
        "tools": ["save_note"],
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


def registered_agents() -> dict[str, dict[str, Any]]:
    """Every registered agent's raw spec by name (built-ins and the agents file)."""
    return {name: dict(spec) for name, spec in sorted(_registered().items())}


def resolve_agent(agent: AgentSpec | str) -> AgentSpec:
    """A spec, or a registered agent by name. Agent tools naming a registered agent get its
    spec now: the run stores a self-contained spec (workers do not read the agents file)."""
    if isinstance(agent, AgentSpec):
        return _resolve_tool_agents(agent)
    spec = _registered().get(agent)
    if spec is None:
        raise NotFound(f"no registered agent named {agent!r}; known: {', '.join(agent_names())}")
    return _resolve_tool_agents(AgentSpec.model_validate(spec))


def _resolve_tool_agents(spec: AgentSpec, depth: int = 0) -> AgentSpec:
    """Agent tools naming a registered agent get its spec, and a sub-agent's (a tool agent
    run as a child run) own agent tools too, at most ``MAX_DEPTH`` levels down (a
    registered agent may name itself)."""
    if not any(isinstance(t, InlineTool) and t.agent is not None for t in spec.tools):
        return spec
    tools = [_resolve_tool(tool, depth) for tool in spec.tools]
    return spec.model_copy(update={"tools": tools})


def _resolve_tool(tool: str | InlineTool, depth: int) -> str | InlineTool:
    if not isinstance(tool, InlineTool) or tool.agent is None:
        return tool
    sub = _tool_agent(tool.name, tool.agent) if isinstance(tool.agent, str) else tool.agent
    if sub.kind == "agent":
        if depth >= MAX_DEPTH:
            raise SpecError(f"tool {tool.name!r}: sub-agents nest at most {MAX_DEPTH} levels")
        sub = _resolve_tool_agents(sub, depth + 1)
    return tool.model_copy(update={"agent": sub})


def _tool_agent(tool: str, name: str) -> AgentSpec:
    raw = _registered().get(name)
    if raw is None:
        raise SpecError(f"tool {tool!r}: no registered agent named {name!r}; "
                        f"known: {', '.join(agent_names())}")
    return AgentSpec.model_validate(raw)
