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
    "paused_call_ids",
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


def paused_call_ids(then: After) -> frozenset[str]:
    """The calls whose tool message the pause will supply: the ask's call (the answer), or
    the approval's items (the writes once decided)."""
    if isinstance(then, AwaitAnswer):
        return frozenset({str(then.ask["ask_id"])})
    if isinstance(then, AwaitApproval):
        return frozenset(str(item["call_id"]) for item in then.items)
    return frozenset()


@dataclass(frozen=True, slots=True)
class RunTools:
    """Every call of a reply and what happens at the join.

    Invariant (every assistant tool call gets exactly one tool message before the next model
    request): a call is ``pending`` (its result comes from running it), ``done`` (its result
    is known), or ``waiting`` only when ``then`` is the pause that answers it."""

    calls: tuple[PlannedCall, ...]
    then: After

    def __post_init__(self) -> None:
        waiting = frozenset(c.call_id for c in self.calls if c.status == "waiting")
        if waiting != paused_call_ids(self.then):
            raise ValueError(
                f"waiting calls {sorted(waiting)} do not match the pause "
                f"{type(self.then).__name__} ({sorted(paused_call_ids(self.then))})"
            )

    @property
    def external(self) -> tuple[PlannedCall, ...]:
        return tuple(c for c in self.calls if c.status == "pending")


Decision = RunTools | Continue | AwaitAnswer | AwaitApproval | Finish | Fail
