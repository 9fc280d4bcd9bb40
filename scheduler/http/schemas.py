"""Request and response bodies of the HTTP API (docs/api.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from fastapi import Path
from pydantic import AwareDatetime, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from shared.agent.approval import ItemDecision
from shared.agent.spec import HTTP_URL, NOT_BLANK, AgentSpec, WebhookSpec
from shared.engine.attachments import DATA_URL_B64
from shared.isotime import iso, iso_or_none, iso_times
from shared.store.deliveries import DURABLE_EVENTS
from shared.vocab import Status

__all__ = [
    "AnswerBody",
    "ApprovalBody",
    "DecisionsBody",
    "ListBody",
    "ERROR_RESPONSES",
    "CURSOR_PATTERN",
    "ID_PATTERN",
    "JsonInt",
    "JsonNumber",
    "JsonTime",
    "NUMBER",
    "TtlSeconds",
    "NOT_BLANK",
    "RunStatus",
    "ErrorBody",
    "ForkLink",
    "InputMessage",
    "MessageList",
    "PathId",
    "ToolCallList",
    "MessageView",
    "Quote",
    "RunCreate",
    "RunList",
    "RunView",
    "message_view",
    "run_view",
    "tool_call_view",
]


ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
PathId = Annotated[str, Path(pattern=ID_PATTERN, description="An id (run_..., thr_..., file_...)")]
CURSOR_PATTERN = r"^[0-9]{1,17}(\.[0-9]{1,17})?:[A-Za-z0-9_-]{1,64}$"
"""A page cursor as ``next_cursor`` gives it (the last run's creation time and id)."""
RunStatus = Literal["scheduled", "queued", "running", "waiting", "completed", "failed", "cancelled"]
MAX_DELAY_S = 366 * 86_400
"""The longest ``delay_s`` of a run (a ``run_at`` may be any time)."""
MAX_TTL_S = 10 * 366 * 86_400


def _json_int(value: Any) -> Any:
    if isinstance(value, bool | str):  # JSON Schema's integer is neither (1.0 is one)
        raise ValueError("Input should be an integer")
    return value


JsonInt = Annotated[int, BeforeValidator(_json_int)]
"""An ``integer`` as JSON Schema means it: 3 and 3.0, not true or "3"."""


def _json_time(value: Any) -> Any:
    if not isinstance(value, str):  # a number is a time to pydantic, not to the schema
        raise ValueError("Input should be an ISO 8601 string")
    return value


_NUMBER = BeforeValidator(_json_int)
NUMBER = _NUMBER
"""The validator of ``JsonInt`` / ``JsonNumber``, for an ``Annotated`` type with its own
bounds (``Annotated[int, Field(ge=1), NUMBER] | None`` states them in the schema)."""
JsonNumber = Annotated[float, _NUMBER]
"""A ``number`` as JSON Schema means it: 3 and 3.5, not true or "3"."""
JsonTime = Annotated[AwareDatetime, BeforeValidator(_json_time)]
"""A ``date-time`` string with its offset."""
TtlSeconds = Annotated[float, Field(gt=0, le=MAX_TTL_S, allow_inf_nan=False), _NUMBER]
"""Retention of one run (or a cron's runs): seconds after it ended, at most ten years."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InputMessage(_Strict):
    role: Literal["system", "user", "assistant"]
    content: str | list[dict[str, Any]]


class Quote(_Strict):
    q: str
    a: str | None = None
    source: str | None = None


class QuotesFrom(_Strict):
    dataset: str = Field(min_length=1, max_length=200)
    k: int = Field(default=5, ge=1, le=50)


class RunWebhook(WebhookSpec):
    """A run's webhook as the API takes it: an http(s) URL, durable event names (or ``*``)."""

    url: str = Field(max_length=2048, pattern=HTTP_URL)
    events: (
        list[
            Annotated[
                str,
                Field(max_length=64, json_schema_extra={"enum": [*sorted(DURABLE_EVENTS), "*"]}),
            ]
        ]
        | None
    ) = Field(default=None, max_length=64)


def _both(a: str, a_type: str, b: str, b_type: str) -> dict[str, Any]:
    """JSON schema: ``a`` and ``b`` both given (not null)."""
    return {"required": [a, b], "properties": {a: {"type": a_type}, b: {"type": b_type}}}


class RunCreate(_Strict):
    model_config = ConfigDict(
        json_schema_extra={  # ``_when``, as a schema
            "allOf": [
                {"not": _both("run_at", "string", "delay_s", "number")},
                {"not": _both("thread_id", "string", "run_at", "string")},
                {"not": _both("thread_id", "string", "delay_s", "number")},
            ]
        }
    )

    agent: AgentSpec | Annotated[str, Field(min_length=1, max_length=200)] = Field(
        description='An agent spec, or a named agent: "name" (the latest version) or "name@3"'
    )
    input: (
        Annotated[str, Field(min_length=1, pattern=NOT_BLANK)]
        | Annotated[list[InputMessage], Field(min_length=1)]
    ) = Field(
        description="The question (not blank), or a list of messages whose last one is the "
        "user's (a rule a schema cannot state: another last role is a 422)"
    )
    thread_id: str | None = Field(default=None, max_length=40, pattern=ID_PATTERN)
    attachments: list[
        Annotated[str, Field(pattern=ID_PATTERN)] | Annotated[str, Field(pattern=DATA_URL_B64)]
    ] = Field(
        default_factory=list,
        max_length=20,
        description="Uploaded files' ids, or base64 data: URLs (stored as files)",
    )
    quotes: list[Quote] = Field(default_factory=list, max_length=200)
    quotes_from: QuotesFrom | None = Field(
        default=None, description="Quotes for a chat run from a dataset search on the question"
    )
    metadata: dict[str, Any] | None = None
    webhook: RunWebhook | None = None
    run_at: JsonTime | None = Field(
        default=None,
        description="Start then (ISO 8601 with a timezone): the run is `scheduled` until "
        "then; a past time starts it now. Not with `delay_s`, not on a thread",
    )
    delay_s: Annotated[float, Field(ge=0, le=MAX_DELAY_S, allow_inf_nan=False), _NUMBER] | None = (
        Field(
            default=None,
            description="Start this many seconds from now (at most 366 days); not with `run_at`",
        )
    )
    priority: JsonInt = Field(
        default=5, ge=0, le=9, description="0-9, 9 first: the broker priority of its rounds"
    )
    ttl_s: TtlSeconds | None = Field(
        default=None,
        description="Retention: the run and all its rows are deleted this many seconds after "
        "it ended",
    )

    @model_validator(mode="after")
    def _when(self) -> RunCreate:
        if self.run_at is not None and self.delay_s is not None:
            raise ValueError("give run_at or delay_s, not both")
        if self.thread_id is not None and (self.run_at is not None or self.delay_s is not None):
            raise ValueError("a run on a thread cannot be scheduled (use a cron with thread_id)")
        return self

    def start_at(self, now: float) -> float | None:
        """When the run starts (epoch seconds), if later than ``now``; None: at once."""
        if self.run_at is not None:
            at = self.run_at.timestamp()
        elif self.delay_s:
            at = now + self.delay_s
        else:
            return None
        return at if at > now else None


class AnswerBody(_Strict):
    ask_id: str = Field(min_length=1, max_length=200)
    answers: list[str] = Field(max_length=3)


_CallIdStr = Annotated[str, Field(min_length=1, max_length=128)]


class ApproveItem(_Strict):
    """Run the proposed write as the model asked."""

    call_id: _CallIdStr
    action: Literal["approve"]


class RejectItem(_Strict):
    """Do not run it; the model reads ``Declined by user[: message]``."""

    call_id: _CallIdStr
    action: Literal["reject"]
    message: str | None = Field(default=None, max_length=4000)


class EditItem(_Strict):
    """Run it with these arguments instead (checked against the tool's schema: 422)."""

    call_id: _CallIdStr
    action: Literal["edit"]
    arguments: dict[str, Any]


ItemBody = Annotated[ApproveItem | RejectItem | EditItem, Field(discriminator="action")]


class DecisionsBody(_Strict):
    """A decision per proposed write; a write without one is rejected. ``note`` reaches the
    model in the summary round."""

    approval_id: str = Field(min_length=1, max_length=200)
    decisions: list[ItemBody] = Field(min_length=1, max_length=256)
    note: str | None = Field(default=None, max_length=4000)

    def items(self) -> list[ItemDecision]:
        return [ItemDecision.model_validate(d.model_dump()) for d in self.decisions]


class ListBody(_Strict):
    """The list form: ``approve`` (call ids, or ``"all"``) run, the others are rejected."""

    approval_id: str = Field(min_length=1, max_length=200)
    approve: list[_CallIdStr] | Literal["all"] = Field(max_length=256)
    reject: list[_CallIdStr] | None = Field(default=None, max_length=256)
    note: str | None = Field(default=None, max_length=4000)


ApprovalBody = DecisionsBody | ListBody


class UsageView(BaseModel):
    input_tokens: int
    output_tokens: int
    cost: float


class ForkLink(BaseModel):
    run_id: str
    round: int


class RunView(BaseModel):
    id: str
    status: str
    kind: str
    stop_reason: str | None
    round: int
    plan: dict[str, Any] | None
    pending: dict[str, Any] | None
    usage: UsageView
    result: dict[str, Any] | None
    error: dict[str, Any] | None
    attempts: int = Field(default=0, description="Tries of the current round so far (L-12)")
    last_error: dict[str, Any] | None = Field(
        default=None,
        description="Why the current round's last try failed: {type, message, attempt, failed_at}",
    )
    agent: dict[str, Any]
    agent_ref: str | None = Field(
        default=None, description='The named agent it runs: "name", or "name@3" (the version)'
    )
    thread_id: str | None
    parent_run_id: str | None = None
    # a fork: the run and round it branched from (its history is that run's, by reference)
    forked_from: ForkLink | None = None
    metadata: dict[str, Any] | None
    # SPEC P-5: what was dropped from the spec, e.g. a tool named like an internal one
    warnings: list[str] = Field(default_factory=list)
    run_at: str | None = Field(default=None, description="A scheduled run: when it starts")
    priority: int = 5
    ttl_s: float | None = None
    created_at: str
    updated_at: str


class RunList(BaseModel):
    runs: list[RunView]
    next_cursor: str | None


class ToolCallView(BaseModel):
    id: str
    name: str
    arguments: str


class MessageView(BaseModel):
    seq: int
    round: int
    role: str
    content: str | list[dict[str, Any]] | None
    reasoning: str | None
    tool_calls: list[ToolCallView]
    tool_call_id: str | None
    name: str | None
    hidden: bool
    kind: str | None = None


def run_view(row: Mapping[Any, Any]) -> RunView:
    pending = row["pending"]
    if pending is not None and row["status"] != Status.WAITING:
        pending = None
    return RunView(
        id=row["id"],
        status=row["status"],
        kind=row["kind"],
        stop_reason=row["stop_reason"],
        round=row["round"],
        plan=row["plan"],
        pending=iso_times(pending),
        usage=UsageView(
            input_tokens=row["input_tokens"],
            output_tokens=row["output_tokens"],
            cost=round(row["cost"], 8),
        ),
        result=row["result"],
        error=row["error"],
        attempts=row.get("attempts", 0),
        last_error=iso_times(row.get("last_error")),
        agent=row["agent"],
        agent_ref=row.get("agent_ref"),
        thread_id=row["thread_id"],
        parent_run_id=row["parent_run_id"],
        forked_from=_fork_link(row),
        metadata=row["meta"],
        warnings=list(row.get("warnings") or ()),
        run_at=iso_or_none(row["wake_at"]) if row["status"] == Status.SCHEDULED else None,
        priority=row.get("priority", 5),
        ttl_s=row.get("ttl_s"),
        created_at=iso(row["created_at"]),
        updated_at=iso(row["updated_at"]),
    )


def _fork_link(row: Mapping[Any, Any]) -> ForkLink | None:
    if row.get("base_kind") != "fork":
        return None
    return ForkLink(run_id=row["base_run_id"], round=row["fork_round"] or 0)


def message_view(row: Mapping[Any, Any]) -> MessageView:
    """The message's columns (its tool calls as the API shows them)."""
    calls = [ToolCallView(**c) for c in row["tool_calls"] or []]
    return MessageView.model_validate({**row, "tool_calls": calls})


class FieldError(BaseModel):
    """One invalid field of a 422: ``path`` names it as the client sent it (``agent.tools.0.name``,
    a query parameter's name; empty for the body as a whole)."""

    path: str
    message: str
    type: str = Field(description="pydantic's error type (missing, string_type, ...)")


class ErrorDetail(BaseModel):
    code: str
    message: str
    details: list[FieldError] | None = Field(
        default=None, description="A 422's invalid fields (``invalid_request``)"
    )


class ErrorBody(BaseModel):
    """Every error: ``{"error": {"code", "message", "details"?}}``."""

    error: ErrorDetail


class MessageList(BaseModel):
    messages: list[MessageView]


class ToolCallRow(BaseModel):
    call_id: str
    round: int
    idx: int
    name: str
    arguments: str
    read_only: bool
    status: str
    attempts: int
    result: str | None
    error: str | None
    cost: float
    started_at: str | None
    finished_at: str | None
    decision: dict[str, Any] | None = Field(
        default=None,
        description="A proposed write's decision: action (approve, edit, reject), by (the "
        "API key id, tenant or resume-token), at, message, proposed_arguments and arguments",
    )


def tool_call_view(row: Mapping[str, Any]) -> ToolCallRow:
    view = {**row, "started_at": iso_or_none(row["started_at"])}
    decision = (row["data"] or {}).get("decision")
    if decision is not None:
        decision = iso_times(decision)
    return ToolCallRow.model_validate(
        {**view, "finished_at": iso_or_none(row["finished_at"]), "decision": decision}
    )


class ToolCallList(BaseModel):
    tool_calls: list[ToolCallRow]


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "No valid API key (or resume token)"},
    403: {"model": ErrorBody, "description": "The API key lacks the scope"},
    404: {"model": ErrorBody, "description": "Not found for this tenant"},
    409: {"model": ErrorBody, "description": "The state forbids it"},
    413: {"model": ErrorBody, "description": "Over a size limit"},
    422: {"model": ErrorBody, "description": "Invalid request (field paths in details)"},
    429: {"model": ErrorBody, "description": "Over a rate or in-flight limit (Retry-After)"},
}
"""The error responses of the /v1 routes (every error has the same body)."""
