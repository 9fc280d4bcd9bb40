"""An agent's A2A card (docs/a2a.md): its JSON-RPC interface at ``/a2a/{agent}``, streaming
and push notifications, API keys as its security, and skills from its spec: the agent itself
(its kind and what it does: asks, approvals, plans, memory), then each tool it may use."""

from __future__ import annotations

from a2a.types import a2a_pb2 as pb

from shared.agent.spec import AgentSpec, InlineTool
from shared.tools import REGISTRY

__all__ = ["agent_card", "skills"]

TEXT = ["text/plain"]
JSON = ["application/json"]


def _tags(spec: AgentSpec) -> list[str]:
    tools = {t for t in spec.tools if isinstance(t, str)}
    flags = {
        "asks": spec.ask,
        "approvals": spec.guarded,
        "plans": spec.plan,
        "memory": bool(tools & {"remember", "recall"}),
        "structured-output": spec.output_schema is not None,
    }
    return [spec.kind, *(name for name, on in flags.items() if on)]


def _tool_skill(agent: str, tool: str | InlineTool) -> pb.AgentSkill | None:
    if isinstance(tool, InlineTool):
        name, description = tool.name, tool.description or f"The {tool.name} tool"
    else:
        try:
            name, description = tool, REGISTRY.get(tool).description
        except KeyError:
            return None
    return pb.AgentSkill(
        id=f"{agent}.{name}", name=name, description=description or name, tags=["tool"]
    )


def skills(name: str, spec: AgentSpec, description: str) -> list[pb.AgentSkill]:
    """The agent as a skill, then a skill per tool of its spec."""
    main = pb.AgentSkill(
        id=name,
        name=name,
        description=description,
        tags=_tags(spec),
        input_modes=TEXT,
        output_modes=TEXT + (JSON if spec.output_schema is not None else []),
    )
    tools = [s for s in (_tool_skill(name, t) for t in spec.tools) if s is not None]
    return [main, *tools]


def agent_card(name: str, spec: AgentSpec, described: str | None, url: str) -> pb.AgentCard:
    first = spec.system_prompt.strip().split("\n", 1)[0][:300]
    description = described or first or f"The treadle agent {name} ({spec.kind})"
    bearer = pb.HTTPAuthSecurityScheme(scheme="bearer", description="A treadle API key")
    api_key = pb.APIKeySecurityScheme(location="header", name="X-API-Key")
    return pb.AgentCard(
        name=name,
        description=description,
        version="0.1.0",
        supported_interfaces=[
            pb.AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0")
        ],
        capabilities=pb.AgentCapabilities(streaming=True, push_notifications=True),
        security_schemes={
            "bearer": pb.SecurityScheme(http_auth_security_scheme=bearer),
            "apiKey": pb.SecurityScheme(api_key_security_scheme=api_key),
        },
        security_requirements=[pb.SecurityRequirement(schemes={"bearer": pb.StringList()})],
        default_input_modes=TEXT + JSON,
        default_output_modes=TEXT + JSON,
        skills=skills(name, spec, description),
    )
