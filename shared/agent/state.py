"""The run's loop state: everything a round needs besides the transcript.

It is stored with every checkpoint (the ``runs`` row) and versioned by ``SCHEMA_VERSION``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

__all__ = ["SCHEMA_VERSION", "CatalogEntry", "LoopState"]

SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    """A tool as the loop sees it: pure data, no executable."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object"})
    read_only: bool = False
    internal: bool = False


@dataclass(frozen=True, slots=True)
class LoopState:
    round: int = 0  # model rounds committed
    tool_only_rounds: int = 0  # L-3: consecutive rounds with tool calls and no answer text
    identical_rounds: int = 0  # L-3: consecutive rounds with the same calls
    last_signature: str | None = None
    tool_calls: int = 0  # L-9: tool calls made so far
    cost: float = 0.0  # L-10: model + tool cost
    input_tokens: int = 0
    output_tokens: int = 0
    finalizing: str | None = None  # a budget stop reason whose final answer call is under way
    last_text: str = ""  # the last answer text (L-2: the result on max_rounds)
    output_repairs: int = 0  # repair rounds for an answer that failed the output_schema
    # model failover (docs/cost.md): 0 = the spec's profile serves; n = its fallback[n - 1],
    # since ``failover_at`` (back to the primary after the profile's cool-down)
    profile_index: int = 0
    failover_at: float | None = None
    # guardrails (docs/guardrails.md) that passed: "input:<name>" (not run again)
    guardrails_passed: tuple[str, ...] = ()
    # handoffs (docs/handoffs.md): the names taken from the submitted spec to the agent that
    # serves now (empty: the submitted agent)
    handoffs: tuple[str, ...] = ()
    # L-8: the run's message tokens when its last compression failed (0: none since the last
    # checkpoint); the next try waits for them to grow (``compression.compression_due``)
    compress_failed_at: int = 0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["v"] = SCHEMA_VERSION
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> LoopState:
        if not d:
            return cls()
        version = d.get("v", SCHEMA_VERSION)
        if version > SCHEMA_VERSION:
            raise ValueError(f"loop state version {version} is newer than this code")
        known = {f for f in cls.__dataclass_fields__}
        values = {k: v for k, v in d.items() if k in known}
        for k in ("guardrails_passed", "handoffs"):  # JSON lists
            if k in values:
                values[k] = tuple(values[k] or ())
        return cls(**values)

    def with_guardrails(self, passed: tuple[str, ...]) -> LoopState:
        return replace(self, guardrails_passed=passed)

    def add_usage(self, input_tokens: int, output_tokens: int, cost: float) -> LoopState:
        return replace(
            self,
            input_tokens=self.input_tokens + input_tokens,
            output_tokens=self.output_tokens + output_tokens,
            cost=self.cost + cost,
        )
