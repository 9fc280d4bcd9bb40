"""A chat or helper agent used as a tool of a tool agent (SPEC C-4: "the answer is also the
run's text, so a chat agent can serve as a tool of another agent").

An inline tool with ``agent: <spec>`` becomes an ``AgentTool``: each call makes ONE model call
for the sub-agent, built by the same request builder and decided by the same ``step`` as a
run of that kind, and returns its answer text (a helper kind: its structured result as JSON)
with the call's cost as the tool's cost (L-10). It runs as an ordinary external tool call, so
it is as durable as any: leased, re-run after a crash, its result committed with the join.
Registered agent names are resolved by the API when the run is submitted.

A tool agent (``kind: agent``) is a ``SubAgentTool``: the engine does not execute it here but
starts a child run for each call (``shared.engine.children``); the child's answer becomes the
call's result when the child ends.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from shared.agent.chat import DATASET_QUOTE_TEMPLATE, DEFAULT_QUOTE_TEMPLATE
from shared.agent.decisions import Finish
from shared.agent.knowledge import passage_quotes
from shared.agent.messages import Message
from shared.agent.pricing import price_call
from shared.agent.request import plan_request
from shared.agent.spec import AgentSpec, InlineTool, ModelProfile
from shared.agent.state import LoopState
from shared.agent.step import step
from shared.errors import ConfigError, ToolError
from shared.llm.base import ModelRequest
from shared.llm.profiles import make_model, resolve_profile
from shared.tools.base import ToolContext, ToolResult
from shared.tools.inline import InlineFace

__all__ = ["INPUT_SCHEMA", "AgentTool", "SubAgentTool", "agent_answer", "question_of"]

INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"input": {"type": "string", "description": "The question or text to handle."}},
    "required": ["input"],
}
"""The parameters of an agent tool that declares none."""


class _InlineFace(InlineFace):
    """An agent tool's face: its declared parameters, or ``INPUT_SCHEMA`` when none are."""

    @property
    def parameters(self) -> dict[str, Any]:
        """The declared parameters; ``INPUT_SCHEMA`` when none are declared."""
        if self._spec.parameters.get("properties"):
            return self._spec.parameters
        return INPUT_SCHEMA


class AgentTool(_InlineFace):
    """A ``Tool`` that answers with one model call of a chat or helper agent."""

    def __init__(
        self, spec: InlineTool, profiles: Mapping[str, ModelProfile] | None = None
    ) -> None:
        if spec.agent is None:
            raise ValueError(f"inline tool {spec.name!r} has no `agent`")
        self._spec = spec
        self._agent = spec.agent
        self._profiles = dict(profiles or {})

    def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        agent = self._agent_spec()
        try:
            profile = resolve_profile(agent.model, self._profiles)
        except ConfigError as exc:
            raise ToolError(str(exc)) from exc
        question = question_of(args)
        quotes = _dataset_quotes(agent, question, ctx)
        request = _request(agent, profile, question, quotes)
        model = make_model(profile, ctx.tenant, ",".join(ctx.allow_hosts))
        reply = model.complete(request, abort=ctx.abort)
        cost = price_call(profile.pricing, reply.usage, profile.own_key) if reply.usage else 0.0
        decision = step(agent, LoopState(), reply, {}, call_cost=cost, question=question).decision
        result = decision.result if isinstance(decision, Finish) else {}
        return ToolResult(
            text=agent_answer(agent, reply.text, result),
            cost=cost,
            data={
                "agent_kind": agent.kind,
                "result": {"text": reply.text, **result},
                "usage": reply.usage.to_dict() if reply.usage else None,
            },
        )

    def _agent_spec(self) -> AgentSpec:
        if isinstance(self._agent, AgentSpec):
            return self._agent
        raise ToolError(
            f"agent {self._agent!r} was not resolved: registered agent names are "
            "resolved when the run is submitted through the API"
        )


def agent_answer(agent: AgentSpec, text: str, result: Mapping[str, Any]) -> str:
    """What the calling model reads: a chat agent's answer text; a helper's structured result
    as JSON (``{"category": ...}``, ``{"fields": ..., "success": ...}``, ``{"queries": ...}``)."""
    if agent.kind == "chat":
        return text
    return json.dumps(dict(result), ensure_ascii=False)


class SubAgentTool(_InlineFace):
    """A tool agent (``kind: agent``) as a tool: each call becomes a child run of the calling
    run (started and joined by the engine, ``shared.engine.children``), never executed here."""

    def __init__(self, spec: InlineTool) -> None:
        if spec.sub_agent is None:
            raise ValueError(f"inline tool {spec.name!r} is not a tool agent")
        self._spec = spec
        self.agent: AgentSpec = spec.sub_agent

    def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        raise ToolError(f"{self.name} is a sub-agent: it runs as a child run of the engine")


def question_of(args: Mapping[str, Any]) -> str:
    """The sub-agent's input: the ``input`` argument, else all arguments as JSON."""
    value = args.get("input")
    if isinstance(value, str):
        return value
    return json.dumps(dict(args), ensure_ascii=False)


def _dataset_quotes(agent: AgentSpec, question: str, ctx: ToolContext) -> list[dict[str, Any]]:
    """A chat agent with ``dataset``: its quotes for the question (SPEC C-2)."""
    if agent.kind != "chat" or not agent.dataset or ctx.knowledge is None:
        return []
    return passage_quotes(ctx.knowledge.search(question, [agent.dataset], agent.dataset_k))


def _request(
    agent: AgentSpec,
    profile: ModelProfile,
    question: str,
    quotes: list[dict[str, Any]] | None = None,
) -> ModelRequest:
    messages = [Message(role="user", content=question)]
    inputs: dict[str, Any] = {"quotes": quotes} if quotes else {}
    if quotes and agent.quote_template == DEFAULT_QUOTE_TEMPLATE:
        agent = agent.model_copy(update={"quote_template": DATASET_QUOTE_TEMPLATE})
    plan = plan_request(
        agent,
        profile=profile,
        state=LoopState(),
        messages=messages,
        catalog={},
        plan=None,
        inputs=inputs,
    )
    return ModelRequest(
        messages=plan.messages, max_tokens=plan.max_tokens, response_format=plan.response_format
    )
