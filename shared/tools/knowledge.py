"""Knowledge search tools (a dataset as a tool of the agent: retrieval, then optionally an
LLM picks the relevant chunks).

* ``knowledge_search`` (registry): ``{query, dataset?, k?}`` over the tenant's datasets (one
  by id or name, or all of them).
* an inline tool ``{name, knowledge: {datasets: [...], k: 5, filter: false}}``: over those
  datasets; ``filter: true`` retrieves more candidates and lets a model (``filter_model``,
  default the agent's) keep the relevant ones, its cost being the tool's (L-10).

Both return numbered passages with their sources; the passages are in the result's data.
Searching goes through ``ToolContext.knowledge`` (the engine's ``Knowledge``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, Field

from shared.agent.knowledge import filter_messages, format_passages, parse_selection
from shared.agent.pricing import price_call
from shared.agent.spec import InlineTool, KnowledgeToolSpec, ModelProfile
from shared.errors import ConfigError, ModelError, ToolError
from shared.llm.base import ModelRequest
from shared.llm.profiles import make_model, resolve_profile
from shared.tools.base import InvalidToolArguments, KnowledgeSource, ToolContext, ToolResult
from shared.tools.inline import InlineFace
from shared.tools.registry import tool

__all__ = ["QUERY_SCHEMA", "KnowledgeTool", "SearchArgs", "knowledge_search"]

QUERY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "description": "What to look for: keywords or a question."}
    },
    "required": ["query"],
}


def _source(ctx: ToolContext) -> KnowledgeSource:
    if ctx.knowledge is None:
        raise ToolError("knowledge search is not available here")
    return ctx.knowledge


def _result(hits: Sequence[Mapping[str, Any]], cost: float = 0.0, **data: Any) -> ToolResult:
    return ToolResult(
        text=format_passages(hits), cost=cost, data={"passages": [dict(h) for h in hits], **data}
    )


class SearchArgs(BaseModel):
    query: str = Field(min_length=1, description="What to look for: keywords or a question.")
    dataset: str | None = Field(
        default=None, description="A dataset id or name; omit to search all of them."
    )
    k: int = Field(default=5, ge=1, le=20, description="How many passages.")


@tool(read_only=True)
def knowledge_search(args: SearchArgs, ctx: ToolContext) -> ToolResult:
    """Search the knowledge base; returns the most relevant passages with their sources."""
    datasets = [args.dataset] if args.dataset else []
    return _result(_source(ctx).search(args.query, datasets, args.k))


class KnowledgeTool(InlineFace):
    """An inline ``knowledge:`` tool over fixed datasets, with the optional LLM filter."""

    def __init__(
        self,
        spec: InlineTool,
        agent_model: str | ModelProfile = "demo",
        profiles: Mapping[str, ModelProfile] | None = None,
    ) -> None:
        if spec.knowledge is None:
            raise ValueError(f"inline tool {spec.name!r} has no `knowledge`")
        self._spec = spec
        self.knowledge: KnowledgeToolSpec = spec.knowledge
        self._model = spec.knowledge.filter_model or agent_model
        self._profiles = dict(profiles or {})

    @property
    def description(self) -> str:
        if self._spec.description:
            return self._spec.description
        names = ", ".join(self.knowledge.datasets)
        return (
            f"Search the knowledge base ({names}) for passages about a question or "
            "keywords; returns the most relevant passages with their sources."
        )

    @property
    def parameters(self) -> dict[str, Any]:
        return QUERY_SCHEMA

    def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        query = str(args.get("query") or "").strip()
        if not query:
            raise InvalidToolArguments(f"Invalid arguments for {self.name}: query: is required")
        k = self.knowledge.k
        wanted = 2 * k if self.knowledge.filter else k  # the filter picks among more
        hits = _source(ctx).search(query, self.knowledge.datasets, wanted)
        if not self.knowledge.filter or not hits:
            return _result(hits[:k])
        return self._filtered(query, hits, k, ctx)

    def _filtered(
        self, query: str, hits: list[dict[str, Any]], k: int, ctx: ToolContext
    ) -> ToolResult:
        """The LLM relevance filter: keep the passages the model picks (in its order); keep
        the retrieval order when its answer cannot be read or the call fails."""
        try:
            profile = resolve_profile(self._model, self._profiles)
            model = make_model(profile, ctx.tenant, ",".join(ctx.allow_hosts))
            reply = model.complete(
                ModelRequest(messages=tuple(filter_messages(query, hits)), max_tokens=200),
                abort=ctx.abort,
            )
        except (ConfigError, ModelError) as exc:
            return _result(hits[:k], filter_error=str(exc))
        cost = price_call(profile.pricing, reply.usage, profile.own_key) if reply.usage else 0.0
        picked = parse_selection(reply.text, len(hits))
        if picked is None:
            return _result(hits[:k], cost, filtered=False)
        return _result([hits[i] for i in picked][:k], cost, filtered=True, candidates=len(hits))
