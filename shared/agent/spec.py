"""The agent spec (DESIGN §8): exact field names, unknown fields rejected."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "AgentSpec",
    "Budget",
    "Category",
    "ExtractField",
    "HttpToolSpec",
    "InlineTool",
    "KnowledgeToolSpec",
    "ModelProfile",
    "PricingTier",
    "RouterRule",
    "WebhookSpec",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PricingTier(_Strict):
    max_input_tokens: int | None = None
    input: float = 0.0  # per 1000 tokens
    output: float = 0.0
    cached_input: float | None = None


class Pricing(_Strict):
    tiers: list[PricingTier] = Field(default_factory=list)


class ModelProfile(_Strict):
    """How to reach one model. The API key itself is never stored: ``api_key_env`` names it."""

    name: str = "inline"
    provider: Literal["openai", "scripted", "demo"] = "openai"
    base_url: str = ""
    model: str = ""
    api_key_env: str | None = None
    tool_mode: Literal["auto", "native", "function", "prompt"] = "auto"
    vision: bool = False
    context_window: int = 128_000
    max_tokens: int = 4096
    own_key: bool = False
    stream: bool = True
    stream_usage: bool = True
    json_schema: bool = False  # supports response_format json_schema (H-2)
    default_system_prompt: str = ""
    pricing: Pricing = Field(default_factory=Pricing)
    extra: dict[str, Any] = Field(default_factory=dict)  # extra request fields
    timeout_connect: float = 10.0
    timeout_read: float = 120.0
    timeout_total: float = 600.0
    max_retries: int = 4
    max_continuations: int = 0  # M-10
    # fleet-wide limits shared by every worker (Redis); None = unlimited
    max_concurrent: int | None = Field(default=None, ge=1)
    requests_per_minute: int | None = Field(default=None, ge=1)
    tokens_per_minute: int | None = Field(default=None, ge=1)
    # provider "scripted": replies by round (tests and demos; see shared.llm.scripted)
    replies: list[dict[str, Any]] = Field(default_factory=list)


class HttpToolSpec(_Strict):
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = "POST"
    url: str
    headers_env: dict[str, str] = Field(default_factory=dict)
    timeout_s: float = 30.0


class KnowledgeToolSpec(_Strict):
    """A ``knowledge_search`` tool over datasets (seed 000 §3.3.5: the dataset sub agent;
    ``filter``: an LLM picks the relevant chunks after retrieval)."""

    datasets: list[str] = Field(min_length=1, max_length=20)  # dataset ids or names
    k: int = Field(default=5, ge=1, le=50)
    filter: bool = False
    filter_model: str | None = None  # a named profile; default: the agent's model


class InlineTool(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str = ""
    read_only: bool = False  # N-5: unknown kind counts as a write
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    http: HttpToolSpec | None = None
    # a sub-agent used as a tool: a chat or helper agent answers in one call (C-4); a tool
    # agent (kind agent) runs as a child run of the calling run
    agent: AgentSpec | str | None = None
    knowledge: KnowledgeToolSpec | None = None  # search datasets

    @model_validator(mode="after")
    def _one_kind(self) -> InlineTool:
        kinds = [k for k in ("http", "agent", "knowledge") if getattr(self, k) is not None]
        if len(kinds) > 1:
            raise ValueError(
                f"an inline tool has one of `http`, `agent`, `knowledge`, not {' and '.join(kinds)}"
            )
        if self.knowledge is not None and "read_only" not in self.model_fields_set:
            self.read_only = True  # a search has no effect outside the run
        return self

    @property
    def sub_agent(self) -> AgentSpec | None:
        """The spec of a tool agent run as a child run (kind agent), else None."""
        if isinstance(self.agent, AgentSpec) and self.agent.kind == "agent":
            return self.agent
        return None


class RouterRule(_Strict):
    any: list[str] = Field(default_factory=list)
    all: list[str] = Field(default_factory=list)
    handler: str | None = None
    pass_to_model: bool = False

    @model_validator(mode="after")
    def _one_target(self) -> RouterRule:
        if not self.any and not self.all:
            raise ValueError("a router rule needs `any` or `all` keywords")
        if bool(self.handler) == self.pass_to_model:
            raise ValueError("a router rule needs exactly one of `handler` or `pass_to_model`")
        return self


class Budget(_Strict):
    max_cost: float | None = None
    deadline_s: float | None = None
    max_tool_calls: int | None = None


class Category(_Strict):
    key: str
    description: str = ""


class ExtractField(_Strict):
    name: str
    type: Literal["string", "number", "integer", "boolean", "array", "object"] = "string"
    description: str = ""
    required: bool = False
    enum: list[Any] | None = None
    default: Any = None


class WebhookSpec(_Strict):
    # no whitespace or control characters: the URL is stored as text (PostgreSQL refuses NUL)
    url: str = Field(max_length=2048, pattern=r"^[^\s\x00-\x1f\x7f]+$")
    events: list[Annotated[str, Field(max_length=64)]] | None = Field(default=None, max_length=64)
    secret_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


class AgentSpec(_Strict):
    kind: Literal["chat", "agent", "classify", "extract", "expand_query"] = "agent"
    model: str | ModelProfile = "demo"
    system_prompt: str = ""
    tools: list[str | InlineTool] = Field(default_factory=list)
    plan: bool = False
    ask: bool = False
    guarded: bool = False
    router: list[RouterRule] = Field(default_factory=list)
    parallel_tools: int | None = Field(default=None, ge=1, le=64)
    max_rounds: int | None = Field(default=None, ge=1, le=10_000)
    force_answer_after: int = Field(default=5, ge=1)
    final_answer_on_limit: bool = False
    budget: Budget = Field(default_factory=Budget)
    ask_timeout_s: float | None = Field(default=None, gt=0)
    ask_timeout_action: Literal["answer", "fail"] = "answer"
    tool_result_max_tokens: int | None = Field(default=None, ge=64)
    # kind: chat
    quote_role: Literal["system", "user"] = "system"
    quote_template: str = "{{q}}\n{{a}}"
    quote_prompt: str | None = None
    stream_reasoning: bool = True
    stream_answer: bool = True
    dataset: str | None = None  # quotes taken from this dataset (id or name) for the question
    dataset_k: int = Field(default=5, ge=1, le=50)
    # kind: classify
    categories: list[Category] = Field(default_factory=list)
    # kind: extract
    fields: list[ExtractField] = Field(default_factory=list)
    # kind: expand_query
    count: int = Field(default=10, ge=1, le=50)
    keep: int = Field(default=3, ge=1, le=50)

    @model_validator(mode="after")
    def _kind_needs(self) -> AgentSpec:
        if self.kind == "classify" and not self.categories:
            raise ValueError("kind classify needs at least one category")
        if self.kind == "extract" and not self.fields:
            raise ValueError("kind extract needs at least one field")
        return self

    @property
    def effective_max_rounds(self) -> int:
        """SPEC L-2 defaults: guarded 6, planning 100, tool agent 50; one-call kinds 1."""
        if self.max_rounds is not None:
            return self.max_rounds
        if self.kind != "agent":
            return 1
        if self.guarded:
            return 6
        return 100 if self.plan else 50

    @property
    def effective_parallel_tools(self) -> int:
        """SPEC L-4 defaults: planning agent 5, tool agent 1 (serial)."""
        if self.parallel_tools is not None:
            return self.parallel_tools
        return 5 if self.plan else 1


InlineTool.model_rebuild()
