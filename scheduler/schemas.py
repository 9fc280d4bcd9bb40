"""Request and response bodies of the HTTP API (DESIGN §7)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import Path
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.engine import RowMapping

from shared.agent.spec import AgentSpec, WebhookSpec

__all__ = [
    "AnswerBody",
    "ApprovalBody",
    "ERROR_RESPONSES",
    "ID_PATTERN",
    "ErrorBody",
    "MessageList",
    "PathId",
    "ToolCallList",
    "MessageView",
    "Quote",
    "RunCreate",
    "RunList",
    "RunView",
    "iso",
    "message_view",
    "run_view",
]


ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
PathId = Annotated[str, Path(pattern=ID_PATTERN, description="An id (run_..., thr_..., file_...)")]


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


class RunCreate(_Strict):
    agent: AgentSpec | str = Field(description="An agent spec, or the name of a registered agent")
    input: str | list[InputMessage] = Field(description="The question, or a list of messages")
    thread_id: str | None = Field(default=None, max_length=40, pattern=ID_PATTERN)
    attachments: list[str] = Field(default_factory=list, max_length=20)
    quotes: list[Quote] = Field(default_factory=list, max_length=200)
    quotes_from: QuotesFrom | None = Field(
        default=None, description="Quotes for a chat run from a dataset search on the question")
    metadata: dict[str, Any] | None = None
    webhook: WebhookSpec | None = None


class AnswerBody(_Strict):
    ask_id: str = Field(min_length=1, max_length=200)
    answers: list[str] = Field(max_length=3)


class ApprovalBody(_Strict):
    approval_id: str = Field(min_length=1, max_length=200)
    approve: list[str] | Literal["all"]
    reject: list[str] | None = None
    note: str | None = Field(default=None, max_length=4000)


class UsageView(BaseModel):
    input_tokens: int
    output_tokens: int
    cost: float


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
    agent: dict[str, Any]
    thread_id: str | None
    parent_run_id: str | None = None
    metadata: dict[str, Any] | None
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


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).isoformat().replace("+00:00", "Z")


def run_view(row: RowMapping) -> RunView:
    pending = row["pending"]
    if pending is not None and row["status"] != "waiting":
        pending = None
    return RunView(
        id=row["id"], status=row["status"], kind=row["kind"], stop_reason=row["stop_reason"],
        round=row["round"], plan=row["plan"], pending=pending,
        usage=UsageView(input_tokens=row["input_tokens"], output_tokens=row["output_tokens"],
                        cost=round(row["cost"], 8)),
        result=row["result"], error=row["error"], agent=row["agent"], thread_id=row["thread_id"],
        parent_run_id=row["parent_run_id"], metadata=row["meta"],
        created_at=iso(row["created_at"]), updated_at=iso(row["updated_at"]),
    )


def message_view(row: RowMapping) -> MessageView:
    return MessageView(
        seq=row["seq"], round=row["round"], role=row["role"], content=row["content"],
        reasoning=row["reasoning"], tool_calls=[ToolCallView(**c) for c in row["tool_calls"] or []],
        tool_call_id=row["tool_call_id"], name=row["name"], hidden=row["hidden"], kind=row["kind"],
    )


class ErrorDetail(BaseModel):
    code: str
    message: str
    details: Any = None


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
    started_at: float | None
    finished_at: float | None


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

