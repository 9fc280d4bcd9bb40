"""Typed rows: what the store returns. A run travels as a frozen ``Run`` (its hot row), never as
a row mapping; the API's view of a run adds what it was given (``RunRecord``)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from functools import cache
from typing import Any

from shared.vocab import ACTIVE, FINAL, RUNNABLE, CallStatus, Status

__all__ = [
    "ACTIVE",
    "FINAL",
    "RUNNABLE",
    "Call",
    "CallStatus",
    "Run",
    "RunRecord",
    "Status",
]


def _from_mapping(cls: Any, row: Mapping[Any, Any]) -> Any:
    """``cls`` from the row's columns it has (a plain dict first: a SQLAlchemy row mapping's
    lookups are several times slower, and a run row has ~50 columns)."""
    values = dict(row)
    return cls(**{name: values[name] for name in _field_names(cls) if name in values})


@cache
def _field_names(cls: Any) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


class _Readable(Mapping[str, Any]):
    """Rows read like mappings too (``row["status"]``), for the views that show them; code
    that decides uses the attributes."""

    __slots__ = ()

    def __getitem__(self, name: str) -> Any:
        try:
            return getattr(self, name)
        except AttributeError:
            raise KeyError(name) from None

    def _names(self) -> list[str]:
        return [f.name for f in fields(self)]  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())


@dataclass(frozen=True, slots=True)
class Run(_Readable):
    """A run's hot row: everything a transition reads or guards on."""

    id: str
    tenant: str
    kind: str
    status: Status
    version: int
    round: int
    open_calls: int
    msg_seq: int
    event_seq: int
    created_at: float
    updated_at: float
    thread_id: str | None = None
    parent_run_id: str | None = None
    parent_call_id: str | None = None
    stop_reason: str | None = None
    plan: dict[str, Any] | None = None
    pending: dict[str, Any] | None = None
    after_join: dict[str, Any] | None = None
    loop: dict[str, Any] | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    lease_owner: str | None = None
    deadline_at: float | None = None
    wake_at: float | None = None
    redrives: int = 0
    dispatched_at: float | None = None
    attempts: int = 0
    last_error: dict[str, Any] | None = None
    reserved: float = 0.0
    spend_keys: list[str] | None = None
    idempotency_key: str | None = None
    view_start: int = 0
    view_tokens: int = 0
    webhook: dict[str, Any] | None = None
    held: bool = False
    base_run_id: str | None = None
    base_seq: int = 0
    base_kind: str | None = None
    fork_round: int | None = None
    spec_rev: int = 0
    steer: list[dict[str, Any]] | None = None
    priority: int = 5
    ttl_s: float | None = None
    ended_at: float | None = None
    suspend_at: float | None = None

    @classmethod
    def of(cls, row: Mapping[Any, Any]) -> Run:
        run: Run = _from_mapping(cls, row)
        return run if isinstance(run.status, Status) else _with_status(run)

    @property
    def final(self) -> bool:
        return self.status in FINAL


def _with_status(run: Run) -> Run:
    object.__setattr__(run, "status", Status(run.status))
    return run


@dataclass(frozen=True, slots=True)
class RunRecord(_Readable):
    """A run as the API shows it: the hot row and what the run was given."""

    run: Run
    agent: dict[str, Any]
    inputs: dict[str, Any] | None = None
    meta: dict[str, Any] | None = None
    warnings: list[str] | None = None
    agent_ref: str | None = None  # the named agent (and version) it ran

    def __getattr__(self, name: str) -> Any:
        return getattr(self.run, name)

    def _names(self) -> list[str]:
        return [*self.run._names(), "agent", "inputs", "meta", "warnings", "agent_ref"]


@dataclass(frozen=True, slots=True)
class Call(_Readable):
    """A tool call's row."""

    run_id: str
    call_id: str
    round: int
    idx: int
    name: str
    arguments: str
    read_only: bool
    status: CallStatus
    attempts: int = 0
    result: str | None = None
    result_for_model: str | None = None
    error: str | None = None
    cost: float = 0.0
    data: dict[str, Any] | None = None
    lease_owner: str | None = None
    flushed: bool = False
    queued_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None

    @classmethod
    def of(cls, row: Mapping[Any, Any]) -> Call:
        call: Call = _from_mapping(cls, row)
        if not isinstance(call.status, CallStatus):
            object.__setattr__(call, "status", CallStatus(call.status))
        return call

    @property
    def model_text(self) -> str:
        """What the model reads for this call (the reduced result, else the whole one)."""
        text = self.result_for_model if self.result_for_model is not None else self.result
        return text or "(empty)"
