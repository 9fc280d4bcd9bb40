"""What a round decided (model: openai-agents' NextStep* types).

``RunTools`` carries every call of the reply, each already classified; ``then`` says what
happens once the external calls have all finished (the join).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "AwaitAnswer",
    "AwaitApproval",
    "CallStatus",
    "Continue",
    "Decision",
    "Fail",
    "Finish",
    "PlannedCall",
    "RunTools",
    "After",
]

CallStatus = Literal["pending", "done", "waiting"]


@dataclass(frozen=True, slots=True)
class PlannedCall:
    """One tool call of the reply. ``pending`` = an external tool to run; ``done`` = its result
    is already known (internal tool, error, skipped); ``waiting`` = a person must act."""

    call_id: str
    name: str
    arguments: str
    index: int
    status: CallStatus
    read_only: bool = True
    result: str | None = None
    args: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Continue:
    """Queue the next round."""


@dataclass(frozen=True, slots=True)
class AwaitAnswer:
    ask: dict[str, Any]


@dataclass(frozen=True, slots=True)
class AwaitApproval:
    items: tuple[dict[str, Any], ...]


@dataclass(frozen=True, slots=True)
class Finish:
    stop_reason: str
    text: str = ""
    result: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Fail:
    reason: str
    code: str = "failed"


After = Continue | AwaitAnswer | AwaitApproval | Finish


@dataclass(frozen=True, slots=True)
class RunTools:
    calls: tuple[PlannedCall, ...]
    then: After

    @property
    def external(self) -> tuple[PlannedCall, ...]:
        return tuple(c for c in self.calls if c.status == "pending")


Decision = RunTools | Continue | AwaitAnswer | AwaitApproval | Finish | Fail
