"""Request bodies of the LangGraph routes: what the server takes, stated in the schema.

Unknown keys are accepted and ignored (the SDK sends fields treadle has no use for), but every
field treadle reads is typed as strictly as it is checked: a schema-valid body is accepted,
and anything the server refuses is outside the schema. ``interrupt_before`` and
``interrupt_after`` are not supported (treadle pauses on ``ask_user`` and on guarded writes):
they may only be absent or null. One rule no schema can state is left to the description: the
last input message must be the user's.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from scheduler.http.schemas import JsonInt
from scheduler.interop.common import Content, Role
from scheduler.interop.langgraph.stream import ALL_MODES
from shared.agent.spec import HTTP_URL
from shared.interop.thread_ids import CLIENT_THREAD_ID

__all__ = [
    "NO_RESUME",
    "AssistantSearchBody",
    "HistoryBody",
    "LgInput",
    "RunBody",
    "SearchBody",
    "ThreadBody",
]

StreamMode = Literal["values", "updates", "messages-tuple", "messages", "events", "custom"]
Strategy = Literal["reject", "enqueue", "interrupt", "rollback"]
ThreadStatus = Literal["idle", "busy", "interrupted", "error"]
_MISSING = object()
NO_RESUME = _MISSING  # what ``RunBody.resume()`` returns when the body resumes nothing
assert set(StreamMode.__args__) == ALL_MODES  # type: ignore[attr-defined]


class _Open(BaseModel):
    model_config = ConfigDict(extra="ignore")


class RoleMessage(_Open):
    """A message with a ``role``."""

    role: Role
    content: Content = ""


class TypedMessage(_Open):
    """A LangChain message with a ``type`` (and no ``role``)."""

    type: Role
    role: Literal[""] | None = None
    content: Content = ""


Message = Annotated[str, Field(description="a user message")] | RoleMessage | TypedMessage


class LgInput(_Open):
    messages: list[Message] = Field(
        min_length=1, description="The new messages; the last one must be the user's"
    )


class Command(_Open):
    resume: Any = Field(description="The answer to the thread's pending interrupt")


class RunBody(_Open):
    """``POST /threads/{tid}/runs[/stream|/wait]`` and ``POST /runs[/stream|/wait]``: new
    ``input``, or ``command.resume`` to answer the thread's interrupt (exactly one)."""

    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            "oneOf": [
                {"required": ["input"], "properties": {"input": {"type": "object"}}},
                {
                    "required": ["command"],
                    "properties": {"command": {"type": "object", "required": ["resume"]}},
                },
            ]
        },
    )

    assistant_id: str = Field(min_length=1, max_length=200)
    input: LgInput | None = None
    command: Command | dict[str, Any] | None = None
    stream_mode: StreamMode | list[StreamMode] | None = None
    metadata: dict[str, Any] | None = None
    webhook: str | None = Field(default=None, max_length=2048, pattern=HTTP_URL)
    multitask_strategy: Strategy | None = None
    interrupt_before: None = Field(default=None, description="Not supported: absent or null")
    interrupt_after: None = Field(default=None, description="Not supported: absent or null")
    on_disconnect: Literal["cancel", "continue"] | None = None
    config: dict[str, Any] | None = None
    checkpoint_id: str | None = Field(
        default=None, max_length=200, description="Start from this checkpoint (a fork)"
    )
    checkpoint: dict[str, Any] | None = Field(
        default=None, description="``{checkpoint_id}``: the same, as langgraph-sdk sends it"
    )

    @model_validator(mode="after")
    def _input_or_resume(self) -> RunBody:
        if (self.input is None) == (self.resume() is _MISSING):
            raise ValueError("send either input.messages or command.resume (exactly one)")
        return self

    def resume(self) -> Any:
        if isinstance(self.command, Command):
            return self.command.resume
        return _MISSING

    def checkpoint_ref(self) -> str | None:
        """The checkpoint a run starts from (time travel): ``checkpoint_id`` or
        ``checkpoint.checkpoint_id``."""
        ref = self.checkpoint_id or (self.checkpoint or {}).get("checkpoint_id")
        return str(ref) if ref else None


class ThreadBody(_Open):
    thread_id: str | None = Field(default=None, pattern=CLIENT_THREAD_ID)
    metadata: dict[str, Any] | None = None
    if_exists: Literal["raise", "do_nothing"] | None = None


class SearchBody(_Open):
    metadata: dict[str, Any] | None = None
    status: ThreadStatus | None = None
    ids: list[str] | None = Field(default=None, max_length=500)
    limit: JsonInt = Field(default=10, ge=1, le=1000)
    offset: JsonInt = Field(default=0, ge=0)


class AssistantSearchBody(_Open):
    graph_id: str | None = None
    limit: JsonInt = Field(default=10, ge=1, le=1000)
    offset: JsonInt = Field(default=0, ge=0)


class HistoryBody(_Open):
    limit: JsonInt = Field(default=10, ge=1, le=1000)
