"""Named agents: a run may name one instead of sending a spec (``agent: "demo"``).

Registered agents are the operator's: the built-ins below, plus a YAML/JSON file named by
``TREADLE_AGENTS_FILE`` (``name: spec``); they are read-only. A tenant's own agents are
created over the API (``scheduler.http.agent_routes``), each version immutable: ``"name"``
is the latest, ``"name@3"`` version 3, ``"name@prod"`` the version its tag ``prod`` points
at. A registered name wins (a tenant cannot take it).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from shared.agent.spec import AgentSpec, HandoffSpec, InlineTool
from shared.engine.runtime import Runtime
from shared.errors import NotFound, SpecError
from shared.store import agents as agent_store
from shared.store.agents import AgentVersion
from shared.store.ancestry import MAX_DEPTH
from shared.store.db import reading

__all__ = [
    "AGENT_NAME",
    "BUILTIN_AGENTS",
    "DEMO_ASSISTANT",
    "Lookup",
    "Resolved",
    "agent_names",
    "is_registered",
    "load_agent_file",
    "parse_ref",
    "registered_agents",
    "resolve",
    "resolve_agent",
    "store_lookup",
]

AGENT_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
_NAME = re.compile(AGENT_NAME)
_REF = re.compile(r"^(?P<name>[^@]+)@(?:(?P<version>[0-9]{1,9})|(?P<tag>[a-z][a-z0-9_-]{0,31}))$")
Lookup = Callable[[str, int | str | None], AgentVersion | None]
"""A tenant's agents: (name, a version, a tag, or None for the latest) → that version, or
None."""


def _call(call_id: str, tool: str, **arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "name": tool, "arguments": arguments}


# The interactive demo's script (a scripted model: one fixed reply per round). Round 1 plans
# and asks with options, round 2 proposes a guarded write, rounds 3-4 wrap up and answer.
DEMO_ASSISTANT: list[dict[str, Any]] = [
    {
        "sleep": 0.3,
        "reasoning": "The user wants a note saved, but not which kind. I will plan "
        "the work, then ask before writing anything.",
        "tool_calls": [
            _call(
                "call_plan",
                "set_plan",
                name="Save a note",
                steps=["Ask which note to save", "Save the note", "Confirm"],
            ),
            _call(
                "call_ask",
                "ask_user",
                reason="I need to know what the note should hold.",
                questions=[
                    {
                        "question": "Which note should I save?",
                        "options": [
                            {"label": "Meeting summary", "value": "meeting-summary"},
                            {"label": "Shopping list", "value": "shopping-list"},
                            {"label": "Reminder for tomorrow", "value": "reminder"},
                        ],
                    }
                ],
            ),
        ],
    },
    {
        "sleep": 0.3,
        "reasoning": "I have the answer. Saving is a write, so it needs approval.",
        "text": "Thanks. I will save the note now; it needs your approval first.",
        "tool_calls": [
            _call(
                "call_plan_2",
                "update_plan",
                updates=[{"id": "s1", "status": "done"}, {"id": "s2", "status": "in_progress"}],
            ),
            _call(
                "call_save",
                "save_note",
                title="Note from the treadle demo",
                text="Saved by treadle's interactive demo after your answer and approval.",
            ),
        ],
    },
    {
        "sleep": 0.2,
        "reasoning": "The write has its result; closing the plan.",
        "tool_calls": [
            _call(
                "call_plan_3",
                "update_plan",
                updates=[{"id": "s2", "status": "done"}, {"id": "s3", "status": "done"}],
            )
        ],
    },
    {
        "sleep": 0.2,
        "reasoning": "Everything is settled; answering.",
        "text": "Done. I asked what to save, proposed the write and went on with your decision; "
        "the save_note result above shows what happened. (This demo model is scripted: its "
        "replies are fixed.)",
    },
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


def is_registered(name: str) -> bool:
    return name in _registered()


def parse_ref(ref: str) -> tuple[str, int | str | None]:
    """``"name"`` → (name, None); ``"name@3"`` → (name, 3); ``"name@prod"`` → (name,
    "prod"): the version its tag points at."""
    found = _REF.match(ref)
    if found is None:
        return ref, None
    if found["tag"] is not None:
        return found["name"], str(found["tag"])
    return found["name"], int(found["version"])


def store_lookup(rt: Runtime, tenant: str) -> Lookup:
    """The tenant's agents in the database."""

    def lookup(name: str, version: int | str | None) -> AgentVersion | None:
        with reading(rt.engine) as conn:
            return agent_store.get_version(conn, tenant, name, version)

    return lookup


@dataclass(frozen=True)
class Resolved:
    """A run's agent: its self-contained spec, which named agent it is (``"name"`` for a
    registered agent, ``"name@3"`` for a tenant's: the exact version), and what the spec
    policy checks (a tenant's spec, its tool agents that name the tenant's saved agents
    resolved into it; a registered agent's name is the operator's)."""

    spec: AgentSpec
    ref: str | None
    policed: AgentSpec | str


def resolve(agent: AgentSpec | str, lookup: Lookup | None = None) -> Resolved:
    """A spec, or a named agent (registered, or the tenant's through ``lookup``). Agent tools
    naming an agent get its spec now: the run stores a self-contained spec (workers read
    neither the agents file nor the tenant's agents). Saved agents are policed as they run,
    with the policy in force now: ``policed`` holds their specs, wherever they are named."""
    if isinstance(agent, AgentSpec):
        policed = _resolve_tool_agents(agent, lookup, tenants_only=True)
        return Resolved(_resolve_tool_agents(agent, lookup), None, policed)
    spec, ref, tenants = _named(agent, lookup)
    if not tenants:
        return Resolved(_resolve_tool_agents(spec, lookup), ref, ref)
    policed = _resolve_tool_agents(spec, lookup, tenants_only=True)
    return Resolved(_resolve_tool_agents(spec, lookup), ref, policed)


def _named(agent: str, lookup: Lookup | None) -> tuple[AgentSpec, str, bool]:
    """A named agent's own spec, its exact ref, and whether it is a tenant's; NotFound."""
    name, version = parse_ref(agent)
    raw = _registered().get(name)
    if raw is not None:
        if version is not None:
            raise NotFound(f"registered agent {name!r} has no versions; name it without @")
        return AgentSpec.model_validate(raw), name, False
    found = lookup(name, version) if lookup is not None and _NAME.match(name) else None
    if found is None:
        raise NotFound(_unknown(agent))
    return AgentSpec.model_validate(found.spec), found.ref, True


def resolve_agent(agent: AgentSpec | str, lookup: Lookup | None = None) -> AgentSpec:
    """The self-contained spec of ``agent`` (see ``resolve``)."""
    return resolve(agent, lookup).spec


def _unknown(agent: str) -> str:
    return f"no agent named {agent!r}; registered: {', '.join(agent_names())}"


def _resolve_tool_agents(
    spec: AgentSpec, lookup: Lookup | None, depth: int = 0, *, tenants_only: bool = False
) -> AgentSpec:
    """Agent tools naming an agent get its spec, and a sub-agent's (a tool agent run as a
    child run) own agent tools too, at most ``MAX_DEPTH`` levels down (an agent may name
    itself). Handoff targets naming an agent get its spec too (docs/handoffs.md).
    ``tenants_only``: a registered agent's name stays a name (the operator's: not policed)."""
    if spec.handoffs:
        handoffs = [_resolve_handoff(h, lookup, depth, tenants_only) for h in spec.handoffs]
        spec = spec.model_copy(update={"handoffs": handoffs})
    if not any(isinstance(t, InlineTool) and t.agent is not None for t in spec.tools):
        return spec
    tools = [_resolve_tool(tool, lookup, depth, tenants_only) for tool in spec.tools]
    return spec.model_copy(update={"tools": tools})


def _resolve_tool(
    tool: str | InlineTool, lookup: Lookup | None, depth: int, tenants_only: bool
) -> str | InlineTool:
    if not isinstance(tool, InlineTool) or tool.agent is None:
        return tool
    agent = tool.agent
    if isinstance(agent, str):
        sub, tenants = _tool_agent(tool.name, agent, lookup)
        if tenants_only and not tenants:
            return tool
    else:
        sub = agent
    if sub.kind == "agent":
        if depth >= MAX_DEPTH:
            raise SpecError(f"tool {tool.name!r}: sub-agents nest at most {MAX_DEPTH} levels")
        sub = _resolve_tool_agents(sub, lookup, depth + 1, tenants_only=tenants_only)
    return tool.model_copy(update={"agent": sub})


def _resolve_handoff(
    h: HandoffSpec, lookup: Lookup | None, depth: int, tenants_only: bool
) -> HandoffSpec:
    """A handoff's target as a spec (a named agent's, resolved now), its own tool agents and
    handoffs too; a chain of handoffs at most ``MAX_DEPTH`` long (an agent that hands back
    to one before it would be an endless chain: refused)."""
    if isinstance(h.agent, str):
        try:
            target, _, tenants = _named(h.agent, lookup)
        except NotFound:
            raise NotFound(f"handoff {h.name!r}: {_unknown(h.agent)}") from None
        if tenants_only and not tenants:
            return h
    else:
        target = h.agent
    if target.kind != "agent":
        raise SpecError(f"handoff {h.name!r}: {h.agent!r} is not a kind agent spec")
    if depth >= MAX_DEPTH:
        raise SpecError(
            f"handoff {h.name!r}: handoffs chain at most {MAX_DEPTH} agents (an agent may not "
            "hand back to one before it)"
        )
    target = _resolve_tool_agents(target, lookup, depth + 1, tenants_only=tenants_only)
    return h.model_copy(update={"agent": target})


def _tool_agent(tool: str, name: str, lookup: Lookup | None) -> tuple[AgentSpec, bool]:
    """The agent a tool names and whether it is a tenant's; 404 like an unknown top-level
    ``agent`` name."""
    try:
        spec, _, tenants = _named(name, lookup)
    except NotFound:
        raise NotFound(f"tool {tool!r}: {_unknown(name)}") from None
    return spec, tenants
