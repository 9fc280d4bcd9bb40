"""The agent spec (docs/api.md): exact field names, unknown fields rejected."""

from __future__ import annotations

import importlib
import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    field_validator,
    model_validator,
)

from shared.agent.output import check_output_schema

__all__ = [
    "ENV_NAME",
    "HEADER_NAME",
    "HTTP_URL",
    "NOT_BLANK",
    "SPACE",
    "AgentSpec",
    "Budget",
    "Category",
    "ExtractField",
    "GuardCategory",
    "GuardrailModelCheck",
    "GuardrailRule",
    "GuardrailSpec",
    "regex_window",
    "HandoffSpec",
    "HttpToolSpec",
    "InlineTool",
    "KnowledgeToolSpec",
    "McpServerSpec",
    "MemorySpec",
    "ModelProfile",
    "PricingTier",
    "RouterRule",
    "WebhookSpec",
]


SPACE = "\\x09-\\x0d\\x1c-\\x20\\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000"
"""Whitespace as Python's ``str.isspace`` knows it, spelled out for a regex class: ``\\s``
means three different sets to JSON Schema (ECMA), pydantic (Rust) and Python."""
NOT_BLANK = f"[^{SPACE}]"  # a pattern: at least one character that is not whitespace
URL_TEXT = "[!-~]+"  # printable ASCII: a URI (an IDN host in its punycode form), no spaces
HTTP_URL = f"^https?://[!-\\x22$-.0-=@-~]{URL_TEXT[:-1]}*$"
"""An absolute http(s) URL: a host (not ``/``, ``?`` or ``#``) right after the scheme."""
HTTP_TEMPLATE = HTTP_URL
"""An HTTP tool's URL, where ``{placeholders}`` may stand anywhere."""


def _whole(value: Any) -> Any:
    """JSON Schema's integer includes ``5.0``; a strict model would refuse it."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


_WHOLE = BeforeValidator(_whole)
Int = Annotated[int, _WHOLE]  # an integer as JSON means it (5 or 5.0; not "5")

ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
"""An environment variable's name, as a spec may name one (a letter or ``_``, then letters,
digits and ``_``)."""
HEADER_NAME = r"^[A-Za-z0-9][A-Za-z0-9-]{0,63}$"
"""An HTTP header's name, as a spec may set one from an environment variable."""
_RESERVED_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "upgrade",
        "te",
        "trailer",
        "expect",
        "proxy-authorization",
        "proxy-connection",
    }
)


def _settable(name: str) -> str:
    """A header a spec may set: not one that frames or routes the request."""
    if name.lower() in _RESERVED_HEADERS:
        raise ValueError(f"header {name!r} is set by the client itself, not by a spec")
    return name


def _any_case(word: str) -> str:
    """``word`` as a regular expression of any letter case (JSON Schema has no ``(?i)``)."""
    return "".join(f"[{c.upper()}{c.lower()}]" if c.isalpha() else c for c in word)


_EnvName = Annotated[str, Field(pattern=ENV_NAME)]
_HeaderName = Annotated[str, Field(pattern=HEADER_NAME), AfterValidator(_settable)]
_HeadersEnv = Annotated[
    dict[_HeaderName, _EnvName],
    Field(
        max_length=32,
        json_schema_extra={  # what the validators check, stated for the schema's readers
            "additionalProperties": False,
            "propertyNames": {
                "pattern": HEADER_NAME,
                "not": {
                    "pattern": "^("
                    + "|".join(_any_case(h) for h in sorted(_RESERVED_HEADERS))
                    + ")$"
                },
                "description": "A header's name; not one that frames or routes the request "
                "(Host, Content-Length, Transfer-Encoding, Connection, ...)",
            },
        },
    ),
]


class _Strict(BaseModel):
    """Unknown fields refused; numbers finite (JSON parsers accept NaN and ``1e999``); no
    coercion (``1`` is not ``true``, ``"5"`` is not ``5``): a spec means what it says."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


# a name stored as text and shown in logs: no NUL or other control characters
_NAME = r"^[^\x00-\x1f\x7f]+$"


class PricingTier(_Strict):
    max_input_tokens: Annotated[int, Field(ge=0), _WHOLE] | None = None
    input: float = Field(default=0.0, ge=0)  # per 1000 tokens
    output: float = Field(default=0.0, ge=0)
    cached_input: float | None = Field(default=None, ge=0)  # input tokens read from a cache
    reasoning: float | None = Field(default=None, ge=0)  # reasoning tokens (else: output)


class Pricing(_Strict):
    tiers: list[PricingTier] = Field(default_factory=list)


class ModelProfile(_Strict):
    """How to reach one model. The API key itself is never stored: ``api_key_env`` names it."""

    name: str = Field(default="inline", min_length=1, max_length=128, pattern=_NAME)
    provider: Literal["openai", "scripted", "demo"] = "openai"
    base_url: str = Field(default="", max_length=2048)
    model: str = Field(default="", max_length=256)
    api_key_env: _EnvName | None = None
    tool_mode: Literal["auto", "native", "function", "prompt"] = "auto"
    vision: bool = False
    context_window: Int = Field(default=128_000, ge=256, le=100_000_000)
    max_tokens: Int = Field(default=4096, ge=1, le=10_000_000)
    own_key: bool = False
    stream: bool = True
    stream_usage: bool = True
    json_schema: bool = False  # supports response_format json_schema (H-2)
    default_system_prompt: str = ""
    pricing: Pricing = Field(default_factory=Pricing)
    extra: dict[str, Any] = Field(default_factory=dict)  # extra request fields
    # upper bounds for submitted specs: the operator's TREADLE_SPEC_MAX_* settings
    timeout_connect: float = Field(default=10.0, gt=0)
    timeout_read: float = Field(default=120.0, gt=0)
    timeout_total: float = Field(default=600.0, gt=0)
    max_retries: Int = Field(default=4, ge=0)
    # how long a run waits out this provider's outage (transient errors past the retries)
    # when its spec does not say; None: the default, 1800 s
    provider_wait_s: float | None = Field(default=None, ge=0)
    max_continuations: Int = Field(default=0, ge=0)  # M-10
    # failover (docs/cost.md): profiles (by name, the operator's) that serve in turn when this
    # one fails past its retries; back to this one after ``failover_cooldown_s``
    fallback: list[Annotated[str, Field(min_length=1, max_length=128)]] = Field(
        default_factory=list, max_length=8
    )
    failover_cooldown_s: float = Field(default=300.0, ge=0)
    # fleet-wide limits shared by every worker (Redis); None = unlimited
    max_concurrent: Annotated[int, Field(ge=1), _WHOLE] | None = None
    requests_per_minute: Annotated[int, Field(ge=1), _WHOLE] | None = None
    tokens_per_minute: Annotated[int, Field(ge=1), _WHOLE] | None = None
    # provider "scripted": replies by round (tests and demos; see shared.llm.scripted)
    replies: list[dict[str, Any]] = Field(default_factory=list)
    # set by the operator's profile loader only: never from a submitted spec (private
    # attributes are not read from input), so a tenant cannot claim an operator's trust
    _operator: bool = PrivateAttr(default=False)

    @property
    def operator(self) -> bool:
        """An operator's profile (profiles file, built-in): its endpoint is trusted (no SSRF
        pinning) and its fleet limits are shared by every tenant that names it."""
        return self._operator

    def as_operator(self) -> ModelProfile:
        """This profile, marked as the operator's (``shared.llm.profiles`` loads them so)."""
        marked = self.model_copy()
        marked._operator = True
        return marked


class HttpToolSpec(_Strict):
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = "POST"
    url: str = Field(max_length=2048, pattern=HTTP_TEMPLATE)
    headers_env: _HeadersEnv = Field(default_factory=dict)
    timeout_s: float = Field(default=30.0, gt=0)


class KnowledgeToolSpec(_Strict):
    """A ``knowledge_search`` tool over datasets (a dataset as a tool of the agent;
    ``filter``: an LLM picks the relevant chunks after retrieval)."""

    datasets: list[str] = Field(min_length=1, max_length=20)  # dataset ids or names
    k: Int = Field(default=5, ge=1, le=50)
    filter: bool = False
    filter_model: str | None = None  # a named profile; default: the agent's model


def _set(name: str) -> dict[str, Any]:
    """JSON schema: ``name`` is present and not null."""
    return {"required": [name], "properties": {name: {"not": {"type": "null"}}}}


class InlineTool(_Strict):
    model_config = ConfigDict(
        json_schema_extra={  # exactly one of http, agent, knowledge (``_one_kind`` refuses
            # two; a tool with none has nothing to run and is refused at submit)
            "oneOf": [_set("http"), _set("agent"), _set("knowledge")]
        }
    )

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


_ToolName = Annotated[str, Field(min_length=1, max_length=128)]


class McpServerSpec(_Strict):
    """An MCP server whose tools the agent may call: over HTTP (``url``; streamable HTTP, or
    SSE for a URL ending in ``/sse`` or ``transport: sse``) or, for operator-registered agents
    only, a local process over stdio (``command``). ``allow``: only these tools (the server's
    names); ``read_only``: these tools are reads (as is any tool the server annotates
    ``readOnlyHint``); every other tool is a write (N-5)."""

    model_config = ConfigDict(
        json_schema_extra={  # ``_one_endpoint``, as a schema
            "oneOf": [
                {
                    "required": ["url"],
                    "properties": {
                        "url": {"not": {"type": "null"}},
                        "command": {"type": "null"},
                        "transport": {"enum": ["streamable_http", "sse", None]},
                        "env": {"maxProperties": 0},
                    },
                },
                {
                    "required": ["command"],
                    "properties": {
                        "command": {"not": {"type": "null"}},
                        "url": {"type": "null"},
                        "transport": {"enum": ["stdio", None]},
                    },
                },
            ]
        }
    )

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,32}$")
    url: str | None = Field(default=None, max_length=2048, pattern=HTTP_URL)
    transport: Literal["streamable_http", "sse", "stdio"] | None = None
    command: list[Annotated[str, Field(max_length=4096)]] | None = Field(
        default=None, min_length=1, max_length=64
    )
    env: dict[_EnvName, _EnvName] = Field(  # stdio only
        default_factory=dict,
        max_length=32,
        json_schema_extra={"additionalProperties": False, "propertyNames": {"pattern": ENV_NAME}},
    )
    headers_env: _HeadersEnv = Field(default_factory=dict)
    allow: list[_ToolName] | None = Field(default=None, max_length=256)
    read_only: list[_ToolName] = Field(default_factory=list, max_length=256)
    timeout_s: float = Field(default=30.0, gt=0, le=300)

    @model_validator(mode="after")
    def _one_endpoint(self) -> McpServerSpec:
        if (self.url is None) == (self.command is None):
            raise ValueError(f"mcp server {self.name!r}: give exactly one of `url` or `command`")
        if self.command is not None and self.transport not in (None, "stdio"):
            raise ValueError(f"mcp server {self.name!r}: a `command` server speaks stdio")
        if self.url is not None and self.transport == "stdio":
            raise ValueError(f"mcp server {self.name!r}: stdio needs a `command`, not a url")
        if self.env and self.command is None:
            raise ValueError(f"mcp server {self.name!r}: `env` is for stdio servers")
        return self

    @property
    def kind(self) -> Literal["streamable_http", "sse", "stdio"]:
        """The transport: as given, else stdio for a command, SSE for a URL path ending in
        ``/sse``, streamable HTTP otherwise."""
        if self.transport is not None:
            return self.transport
        if self.command is not None:
            return "stdio"
        path = (self.url or "").split("?", 1)[0].rstrip("/")
        return "sse" if path.endswith("/sse") else "streamable_http"


class RouterRule(_Strict):
    model_config = ConfigDict(
        json_schema_extra={  # ``_one_target``, as a schema
            "anyOf": [
                {"required": ["any"], "properties": {"any": {"minItems": 1}}},
                {"required": ["all"], "properties": {"all": {"minItems": 1}}},
            ],
            "oneOf": [
                {
                    "required": ["handler"],
                    "properties": {"handler": {"type": "string", "minLength": 1}},
                },
                {"required": ["pass_to_model"], "properties": {"pass_to_model": {"const": True}}},
            ],
        }
    )

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
    max_cost: float | None = Field(default=None, ge=0)
    deadline_s: float | None = Field(default=None, gt=0)  # at most TREADLE_SPEC_MAX_DEADLINE_S
    max_tool_calls: Annotated[int, Field(ge=0, le=1_000_000), _WHOLE] | None = None


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
    url: str = Field(max_length=2048, pattern=f"^{URL_TEXT}$")
    events: list[Annotated[str, Field(max_length=64)]] | None = Field(default=None, max_length=64)
    secret_env: str | None = Field(default=None, pattern=ENV_NAME)


_Label = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[^.\x00-\x1f\x7f]+$")]


class MemorySpec(_Strict):
    """Long-term memory for the ``remember`` and ``recall`` tools (docs/memory.md): the
    namespace their items live in, a template whose ``{field}`` placeholders are filled from
    the run's metadata (the default keeps each user's memory apart: ``metadata.user_id``)."""

    namespace: list[_Label] = Field(
        default_factory=lambda: ["memories", "{user_id}"], min_length=1, max_length=8
    )
    ttl_s: float | None = Field(default=None, gt=0)  # what remember writes expires after this


def _needs_items(kind: str, field: str) -> dict[str, Any]:
    return {
        "if": {"required": ["kind"], "properties": {"kind": {"const": kind}}},
        "then": {"required": [field], "properties": {field: {"minItems": 1}}},
    }


GUARD_NAME = r"^[A-Za-z0-9_-]{1,64}$"
MAX_GUARD_REGEX = 512  # characters of a rule's pattern (Python ``re``; bounded, no timeout)


class GuardCategory(_Strict):
    """A category of a guardrail's model check; ``trip``: text classified so trips it."""

    key: str = Field(min_length=1, max_length=128)
    description: str = Field(default="", max_length=2000)
    trip: bool = False


def _allow_block() -> list[GuardCategory]:
    return [
        GuardCategory(key="allow", description="acceptable: nothing the instructions forbid"),
        GuardCategory(key="block", description="violates the instructions", trip=True),
    ]


class GuardrailModelCheck(_Strict):
    """A helper-model check, classify-style (SPEC H-1): the text is classified into
    ``categories`` under ``instructions``; a category with ``trip: true`` trips the guardrail.
    Priced and reserved like any call, with its own profile (``model``)."""

    model_config = ConfigDict(
        json_schema_extra={  # ``_trips``, as a schema
            "allOf": [
                {
                    "properties": {
                        "categories": {
                            "contains": {
                                "required": ["trip"],
                                "properties": {"trip": {"const": True}},
                            }
                        }
                    }
                }
            ]
        }
    )

    model: str | ModelProfile = "demo"
    instructions: str = Field(default="", max_length=20_000)
    categories: list[GuardCategory] = Field(
        default_factory=_allow_block, min_length=2, max_length=20
    )

    @model_validator(mode="after")
    def _trips(self) -> GuardrailModelCheck:
        if not any(c.trip for c in self.categories):
            raise ValueError("a guardrail's model check needs a category with `trip: true`")
        return self

    @property
    def as_categories(self) -> list[Category]:
        return [Category(key=c.key, description=c.description) for c in self.categories]

    @property
    def trip_on(self) -> frozenset[str]:
        return frozenset(c.key for c in self.categories if c.trip)


_SRE: Any = importlib.import_module("re._parser")  # the parser ``re`` compiles with
_REPEATS = ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT")
_WIDE = 100  # a repeat of more than this many counts as unbounded
MAX_REGEX_PATHS = 10_000  # the ways the bounded parts of a pattern may match one place
REGEX_STEPS = 10**8  # what one search may cost, at worst: ``regex_window`` sizes the text


class _Risky(ValueError):
    pass


def _paths(items: Any, nested: bool, wide: list[int]) -> float:
    """How many ways ``items`` may match at one place (bounded repeats and alternations
    multiply); refuses what backtracks without bound (``_Risky``)."""
    total = 1.0
    for op, arg in items:
        name = str(op)
        if name in ("GROUPREF", "GROUPREF_EXISTS", "ASSERT", "ASSERT_NOT"):
            raise _Risky("back-references and look-arounds are not allowed in a rule's regex")
        if name in _REPEATS:
            low, high, body = int(arg[0]), int(arg[1]), arg[2]
            inner = _paths(body, True, wide)
            if high > _WIDE:
                if nested or inner > 1:
                    raise _Risky(
                        "a repeat of a repeat or of alternatives (e.g. (a+)+, (a|ab)*) is not "
                        "allowed in a rule's regex"
                    )
                wide[0] += 1
            else:
                total *= (high - low + 1) * inner**high
        elif name == "SUBPATTERN":
            total *= _paths(arg[3], nested, wide)
        elif name == "BRANCH":
            total *= sum(_paths(b, nested, wide) for b in arg[1])
        elif name == "ATOMIC_GROUP":
            total *= _paths(arg, nested, wide)
        if total > MAX_REGEX_PATHS:
            raise _Risky("a rule's regex has too many ways to match (nested optional parts)")
    return total


def _regex_shape(pattern: str) -> tuple[float, int]:
    """The ways a pattern's bounded parts match one place, and its unbounded repeats.
    Raises ``_Risky``."""
    wide = [0]
    paths = _paths(_SRE.parse(pattern), False, wide)
    return paths, wide[0]


def _regex_risk(pattern: str) -> str | None:
    """Why a rule's regex could run for ages on a hostile text (Python's ``re`` backtracks
    and has no timeout), or None: unbounded repeats only of a single character or class,
    outside any other repeat; bounded parts with at most ``MAX_REGEX_PATHS`` ways to match;
    no back-references or look-arounds."""
    try:
        _regex_shape(pattern)
    except _Risky as exc:
        return str(exc)
    return None


def regex_window(pattern: str) -> int:
    """How much of a text a rule's regex searches: a flat pattern with ``k`` unbounded
    repeats costs at worst about ``paths * n ** (k + 1)`` steps on ``n`` characters; ``n``
    is chosen so that stays under ``REGEX_STEPS`` (100,000 characters without unbounded
    repeats, 10,000 with one, about 460 with two)."""
    paths, wide = _regex_shape(pattern)
    return max(16, min(100_000, int((REGEX_STEPS / paths) ** (1 / (wide + 1)))))


class GuardrailRule(_Strict):
    model_config = ConfigDict(
        json_schema_extra={"oneOf": [_set("regex"), _set("json_schema")]}  # ``_one_rule``
    )

    """A local rule: ``regex`` (Python syntax, searched in the text) trips on a match
    (``trip_when: match``) or on no match (``no_match``); ``json_schema``: the text must be a
    JSON object valid against it, else the guardrail trips."""

    regex: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_GUARD_REGEX,
        json_schema_extra={"format": "regex"},  # ``_compiles``: Python's syntax
    )
    trip_when: Literal["match", "no_match"] = "match"
    ignore_case: bool = False
    json_schema: dict[str, Any] | None = Field(
        default=None,  # ``check_output_schema``: an object's schema
        json_schema_extra={"required": ["type"], "properties": {"type": {"const": "object"}}},
    )

    @field_validator("regex")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"regex does not compile: {exc}") from None
            risk = _regex_risk(value)
            if risk is not None:
                raise ValueError(risk)
        return value

    @field_validator("json_schema")
    @classmethod
    def _bounded(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            check_output_schema(value)
        return value

    @model_validator(mode="after")
    def _one_rule(self) -> GuardrailRule:
        if (self.regex is None) == (self.json_schema is None):
            raise ValueError("a guardrail rule has exactly one of `regex` or `json_schema`")
        return self


class GuardrailSpec(_Strict):
    """A check on the run's input (``input_guardrails``) or its final answer
    (``output_guardrails``): exactly one of ``model``, ``rule``, ``plugin`` (a name registered
    with ``shared.engine.guardrails.guardrail``). A tripwire ends the run with
    ``stop_reason: guardrail`` (docs/guardrails.md)."""

    model_config = ConfigDict(
        json_schema_extra={"oneOf": [_set("model"), _set("rule"), _set("plugin")]}
    )

    name: str = Field(pattern=GUARD_NAME)
    model: GuardrailModelCheck | None = None
    rule: GuardrailRule | None = None
    plugin: str | None = Field(default=None, pattern=GUARD_NAME)
    # input only: checked while the first model call runs (aborted if the guardrail trips)
    parallel: bool = False
    # output only: each tool call's arguments are checked too, before the calls run
    tool_calls: bool = False

    @model_validator(mode="after")
    def _one_kind(self) -> GuardrailSpec:
        kinds = [k for k in ("model", "rule", "plugin") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError(
                f"guardrail {self.name!r} has exactly one of `model`, `rule`, `plugin`"
            )
        return self

    @property
    def kind(self) -> Literal["model", "rule", "plugin"]:
        if self.model is not None:
            return "model"
        return "rule" if self.rule is not None else "plugin"


class HandoffSpec(_Strict):
    """An agent this one may hand the run to: the model sees a ``transfer_to_<name>`` tool;
    taking it moves the run to ``agent`` (a registered agent's name, resolved at submit, or
    an inline spec) at the round boundary (docs/handoffs.md). ``input_filter``:
    ``drop_tools`` leaves tool calls and results out of what the new agent's model sees."""

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,48}$")
    description: str = Field(default="", max_length=2000)
    agent: AgentSpec | Annotated[str, Field(min_length=1, max_length=200)] = Field(
        json_schema_extra={  # ``_an_agent``: an inline target is a tool agent
            "if": {"type": "object"},
            "then": {"properties": {"kind": {"const": "agent"}}},
        }
    )
    input_filter: Literal["none", "drop_tools"] = "none"

    @model_validator(mode="after")
    def _an_agent(self) -> HandoffSpec:
        if isinstance(self.agent, AgentSpec) and self.agent.kind != "agent":
            raise ValueError(f"handoff {self.name!r}: the target is a kind agent spec")
        return self

    @property
    def tool_name(self) -> str:
        return f"transfer_to_{self.name}"

    @property
    def spec(self) -> AgentSpec:
        """The target's spec (named agents are resolved into the spec at submit)."""
        if not isinstance(self.agent, AgentSpec):
            raise ValueError(f"handoff {self.name!r}: agent {self.agent!r} was not resolved")
        return self.agent


def _flag_off(name: str) -> dict[str, Any]:
    return {"properties": {name: {"const": False}}}


def _unique_names(items: list[Any], what: str) -> None:
    names = [i.name for i in items]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"duplicate {what} names: {', '.join(dupes)}")


MAX_ATTEMPTS_CAP = 20
"""The most attempts a spec may allow one round or tool call (each may bill a model call)."""


class AgentSpec(_Strict):
    model_config = ConfigDict(
        json_schema_extra={  # ``_kind_needs``, as a schema
            "allOf": [
                _needs_items("classify", "categories"),
                _needs_items("extract", "fields"),
                {  # mcp and output_schema: kind agent only
                    "if": {
                        "required": ["kind"],
                        "not": {"properties": {"kind": {"const": "agent"}}},
                    },
                    "then": {
                        "properties": {
                            "mcp": {"maxItems": 0},
                            "output_schema": {"type": "null"},
                            "handoffs": {"maxItems": 0},
                        }
                    },
                },
                {  # ``parallel`` on input guardrails, ``tool_calls`` on output ones
                    "properties": {
                        "input_guardrails": {"items": _flag_off("tool_calls")},
                        "output_guardrails": {"items": _flag_off("parallel")},
                    }
                },
            ]
        }
    )

    kind: Literal["chat", "agent", "classify", "extract", "expand_query"] = "agent"
    model: str | ModelProfile = "demo"
    system_prompt: str = ""
    tools: list[str | InlineTool] = Field(default_factory=list)
    mcp: list[McpServerSpec] = Field(default_factory=list, max_length=16)
    # kind agent: the final answer is a JSON object valid against this schema (result.data)
    output_schema: dict[str, Any] | None = Field(
        default=None,  # ``check_output_schema``: an object's schema
        json_schema_extra={"required": ["type"], "properties": {"type": {"const": "object"}}},
    )
    plan: bool = False
    ask: bool = False
    guarded: bool = False
    router: list[RouterRule] = Field(default_factory=list)
    parallel_tools: Annotated[int, Field(ge=1, le=64), _WHOLE] | None = None
    max_rounds: Annotated[int, Field(ge=1, le=10_000), _WHOLE] | None = None
    # L-12: attempts of one round (or one tool call) before the run fails with the cause;
    # None: the operator's TREADLE_MAX_ATTEMPTS (5)
    max_attempts: Annotated[int, Field(ge=1, le=MAX_ATTEMPTS_CAP), _WHOLE] | None = None
    force_answer_after: Int = Field(default=5, ge=1, le=10_000)
    final_answer_on_limit: bool = False
    budget: Budget = Field(default_factory=Budget)
    ask_timeout_s: float | None = Field(default=None, gt=0)  # at most TREADLE_SPEC_MAX_ASK_*
    ask_timeout_action: Literal["answer", "fail"] = "answer"
    # transient model errors past the retries: the run waits (holding nothing) this long for
    # its provider, then fails; None: the model profile's, else 1800 s; 0: fail at once
    provider_wait_s: float | None = Field(default=None, ge=0)
    tool_result_max_tokens: Annotated[int, Field(ge=64, le=10_000_000), _WHOLE] | None = None
    # kind: chat
    quote_role: Literal["system", "user"] = "system"
    quote_template: str = "{{q}}\n{{a}}"
    quote_prompt: str | None = None
    stream_reasoning: bool = True
    stream_answer: bool = True
    dataset: str | None = None  # quotes taken from this dataset (id or name) for the question
    dataset_k: Int = Field(default=5, ge=1, le=50)
    # the remember / recall tools' namespace (default: ["memories", "{user_id}"])
    memory: MemorySpec | None = None
    # guardrails (docs/guardrails.md): checks on the input before the first model call, and
    # on the final answer; a tripwire ends the run with stop_reason guardrail
    input_guardrails: list[GuardrailSpec] = Field(default_factory=list, max_length=8)
    output_guardrails: list[GuardrailSpec] = Field(default_factory=list, max_length=8)
    # handoffs (docs/handoffs.md): agents this one may hand the run to (kind agent)
    handoffs: list[HandoffSpec] = Field(default_factory=list, max_length=16)
    # kind: classify
    categories: list[Category] = Field(default_factory=list)
    # kind: extract
    fields: list[ExtractField] = Field(default_factory=list)
    # kind: expand_query
    count: Int = Field(default=10, ge=1, le=50)
    keep: Int = Field(default=3, ge=1, le=50)

    @field_validator("output_schema")
    @classmethod
    def _bounded_schema(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            check_output_schema(value)
        return value

    @model_validator(mode="after")
    def _kind_needs(self) -> AgentSpec:
        if self.kind == "classify" and not self.categories:
            raise ValueError("kind classify needs at least one category")
        if self.kind == "extract" and not self.fields:
            raise ValueError("kind extract needs at least one field")
        if self.kind != "agent" and (self.mcp or self.output_schema is not None):
            raise ValueError("`mcp` and `output_schema` are for kind agent")
        _unique_names(self.mcp, "mcp server")
        if self.handoffs and self.kind != "agent":
            raise ValueError("`handoffs` are for kind agent")
        if any(g.parallel for g in self.output_guardrails):
            raise ValueError("`parallel` is for input guardrails")
        if any(g.tool_calls for g in self.input_guardrails):
            raise ValueError("`tool_calls` is for output guardrails")
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
HandoffSpec.model_rebuild()
