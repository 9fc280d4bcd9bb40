"""What a tool is: the ``Tool`` protocol, its call context and result, and ``FunctionTool``.

A tool failure is data (SPEC L-5): tools raise ``shared.errors.ToolError`` with a message the
model can read; the caller turns it into the tool's result.
"""

from __future__ import annotations

import inspect
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING,
    Any,
    Generic,
    Protocol,
    TypeVar,
    get_type_hints,
    runtime_checkable,
)

from pydantic import BaseModel, ValidationError

from shared.errors import ToolError

if TYPE_CHECKING:
    from shared.llm.abort import Abort
    from shared.tools.confinement import Confinement
    from shared.tools.files import TextCache
    from shared.tools.netguard import GuardedPools

__all__ = [
    "FileSource",
    "FunctionTool",
    "InvalidToolArguments",
    "KnowledgeSource",
    "MemorySource",
    "ProgressSink",
    "Tool",
    "ToolContext",
    "ToolFunction",
    "ToolResult",
    "json_schema_of",
    "validation_message",
]

_MAX_ERRORS_SHOWN = 5
_MAX_MESSAGE_CHARS = 500


class InvalidToolArguments(ToolError):
    """Arguments that fail the tool's schema; the message is the validation message (L-5)."""

    code = "invalid_tool_arguments"


class ProgressSink(Protocol):
    """Takes a tool's progress reports (``ToolContext.progress``)."""

    def __call__(
        self, progress: float | None, total: float | None, message: str | None
    ) -> None: ...


class FileSource(Protocol):
    """Reads the bytes of one of the run's attachments (``ToolContext.attachments`` ids)."""

    def read(self, file_id: str) -> bytes: ...


class KnowledgeSource(Protocol):
    """Searches the calling tenant's datasets (ids or names; none = all of them): the top
    ``k`` passages ``{text, source, document, dataset_id, chunk_id, score}``, best first."""

    def search(self, query: str, datasets: Sequence[str], k: int) -> list[dict[str, Any]]: ...


class MemorySource(Protocol):
    """The run's long-term memory (its agent's namespace, filled from the run's metadata):
    ``remember`` writes an item (``{namespace, key}`` back), ``recall`` finds the ``k``
    items that best match a query (``{key, value, score}``, best first). Failures are
    ``ToolError``s with a message the model can read."""

    def remember(self, key: str | None, value: dict[str, Any]) -> dict[str, Any]: ...

    def recall(self, query: str, k: int) -> list[dict[str, Any]]: ...


@dataclass(frozen=True, slots=True)
class ToolContext:
    """Who is calling and within which limits. ``env`` None means ``os.environ`` at call time.
    ``attachments``: the run's files (``{id, name, content_type, size, sha256}``), whose
    bytes ``files`` reads (None: the run has no readable attachments). ``knowledge`` searches
    the tenant's datasets (None: not available here). ``abort`` stops a call that blocks
    (``shared.llm.abort``): tools that wait on the network or a child process obey it, so a
    timed-out or cancelled call really ends instead of running on in an abandoned thread.
    ``confinement``: the process's slots and cgroups for child processes (None: a call made
    outside the engine gets its own). ``http``: the process's kept-alive connections for
    guarded HTTP calls (``shared.tools.netguard.GuardedPools``; None: each call connects
    afresh). ``texts``: the process's text of the files read (None: a file is read and parsed
    on each call)."""

    run_id: str
    call_id: str
    tenant: str = "default"
    deadline: float | None = None  # epoch seconds
    attachments: tuple[dict[str, Any], ...] = ()
    allow_hosts: tuple[str, ...] = ()  # SSRF allow-list: "host", "host:port" or "*.domain"
    env: Mapping[str, str] | None = None
    files: FileSource | None = None
    knowledge: KnowledgeSource | None = None  # the tenant's datasets (knowledge_search)
    memory: MemorySource | None = None  # the run's long-term memory (remember, recall)
    abort: Abort | None = None
    confinement: Confinement | None = None  # the worker's sandbox slots and cgroups
    http: GuardedPools | None = None  # the worker's kept-alive guarded HTTP connections
    on_progress: ProgressSink | None = None  # where ``progress`` goes (the run's live stream)
    texts: TextCache | None = None  # the worker's extracted file texts (read_files)

    def progress(
        self, progress: float | None = None, total: float | None = None, message: str | None = None
    ) -> None:
        """Report how far the call is (``progress`` of ``total``, and/or a ``message``): the
        run's live stream shows it as a ``tool.progress`` event. Ephemeral, as model deltas
        are (never stored, not replayed); bounded (``shared.engine.progress``); a no-op
        outside a run."""
        if self.on_progress is not None:
            self.on_progress(progress, total, message)

    @property
    def idempotency_key(self) -> str:
        return f"{self.run_id}:{self.call_id}"

    @property
    def environ(self) -> Mapping[str, str]:
        return os.environ if self.env is None else self.env

    def time_left(self, cap: float) -> float:
        """Seconds a call may take: ``cap``, shortened by the deadline; ToolError once past it."""
        if self.deadline is None:
            return cap
        left = self.deadline - time.time()
        if left <= 0:
            raise ToolError("deadline exceeded")
        return min(cap, left)


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What a tool returns: text for the model, an optional cost (L-10), data, a stop flag (L-6)."""

    text: str
    cost: float = 0.0
    data: dict[str, Any] | None = None
    stop: bool = False


@runtime_checkable
class Tool(Protocol):
    """A tool the model can call. ``internal`` tools run alone and in order (L-4)."""

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def parameters(self) -> dict[str, Any]: ...

    @property
    def read_only(self) -> bool: ...

    @property
    def internal(self) -> bool: ...

    def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult: ...


M = TypeVar("M", bound=BaseModel)
ToolFunction = Callable[[M, ToolContext], ToolResult | str]


@dataclass(frozen=True, slots=True)
class FunctionTool(Generic[M]):
    """A tool made of a typed function ``fn(args: Model, ctx) -> ToolResult | str``."""

    name: str
    description: str
    fn: ToolFunction[M]
    args_model: type[M]
    read_only: bool = False  # N-5: unknown kind counts as a write
    internal: bool = False
    # in-process, no I/O, done in well under a second: run without a claim (see
    # shared.engine.toolrun); only for read-only tools
    quick: bool = False
    parameters: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "parameters", json_schema_of(self.args_model))

    @classmethod
    def from_function(
        cls,
        fn: ToolFunction[M],
        *,
        name: str | None = None,
        description: str | None = None,
        read_only: bool = False,
        internal: bool = False,
        quick: bool = False,
        args_model: type[M] | None = None,
    ) -> FunctionTool[M]:
        return cls(
            name=name or fn.__name__,
            description=_describe(fn) if description is None else description,
            fn=fn,
            args_model=args_model or _args_model_of(fn),
            read_only=read_only,
            internal=internal,
            quick=quick and read_only,
        )

    def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            parsed = self.args_model.model_validate(args)
        except ValidationError as exc:
            raise InvalidToolArguments(validation_message(self.name, exc)) from None
        out = self.fn(parsed, ctx)
        return out if isinstance(out, ToolResult) else ToolResult(text=str(out))


def validation_message(tool_name: str, exc: ValidationError) -> str:
    """``Invalid arguments for <tool>: <field>: <problem>; ...``, short enough for the model."""
    parts = [f"{_loc(err['loc'])}: {err['msg']}" for err in exc.errors()[:_MAX_ERRORS_SHOWN]]
    more = exc.error_count() - _MAX_ERRORS_SHOWN
    if more > 0:
        parts.append(f"and {more} more")
    return f"Invalid arguments for {tool_name}: {'; '.join(parts)}"[:_MAX_MESSAGE_CHARS]


def _loc(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc) or "arguments"


def json_schema_of(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema without pydantic's ``title`` noise, always an object schema."""
    schema = _drop_titles(model.model_json_schema())
    schema.setdefault("type", "object")
    schema.setdefault("properties", {})
    return schema


def _drop_titles(schema: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in ("properties", "$defs") and isinstance(value, dict):
            out[key] = {n: _drop_titles(s) if isinstance(s, dict) else s for n, s in value.items()}
        elif isinstance(value, dict):
            out[key] = _drop_titles(value)
        elif isinstance(value, list):
            out[key] = [_drop_titles(v) if isinstance(v, dict) else v for v in value]
        else:
            out[key] = value
    return out


def _describe(fn: Callable[..., Any]) -> str:
    doc = inspect.getdoc(fn) or ""
    return doc.split("\n\n", 1)[0].replace("\n", " ").strip()


def _args_model_of(fn: Callable[..., Any]) -> type[Any]:
    """The pydantic model annotated on the function's first parameter."""
    params = list(inspect.signature(fn).parameters)
    hint = get_type_hints(fn).get(params[0]) if params else None
    if not (isinstance(hint, type) and issubclass(hint, BaseModel)):
        raise TypeError(
            f"{fn.__name__}: the first parameter must be annotated with a pydantic model"
        )
    return hint
