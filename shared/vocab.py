"""The project's vocabulary, defined once: run and call statuses, the status sets, the event
types a run's log and its live stream carry, and the outcomes of a round and of a tool task.

Dependency-free (standard library only), so every room imports it: the engine, the store, the
API schemas, the CLI, the facades. A new status, event type or outcome is added here and
nowhere else.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

__all__ = [
    "DELIVERY_SETTLED",
    "DeliveryStatus",
    "SEGMENT_ENDS",
    "ACTIVE",
    "FINAL",
    "IN_FLIGHT",
    "LIVE_EVENTS",
    "MEMORY_EVENTS",
    "RUNNABLE",
    "TERMINAL_EVENTS",
    "CallStatus",
    "EventType",
    "RoundOutcome",
    "Status",
    "ToolOutcome",
]


class Status(StrEnum):
    """A run's status (the ``runs.status`` column)."""

    SCHEDULED = "scheduled"
    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


FINAL: Final = frozenset({Status.COMPLETED, Status.FAILED, Status.CANCELLED})
"""A run in one of these has ended: nothing more happens to it (but resume or delete)."""
ACTIVE: Final = frozenset({Status.QUEUED, Status.RUNNING, Status.WAITING})
"""Started and not ended."""
RUNNABLE: Final = frozenset({Status.QUEUED, Status.RUNNING})
"""Due for work by a worker (a round, a tool call): what admission counts as in flight."""
IN_FLIGHT: Final = frozenset({Status.SCHEDULED, *ACTIVE})
"""Submitted and not ended: what a tenant's limit on open runs counts."""


class CallStatus(StrEnum):
    """A tool call's status (the ``tool_calls.status`` column)."""

    PENDING = "pending"  # not dispatched yet (a windowed batch)
    QUEUED = "queued"  # dispatched: a tool message is on its way
    RUNNING = "running"  # claimed by a worker (``lease_owner``)
    CHILD = "child"  # a sub-agent call whose child run is working
    WAITING = "waiting"  # a person must act (an approval)
    DONE = "done"


class EventType(StrEnum):
    """The ``type`` of an event in a run's log (``events``) or its live stream."""

    RUN_QUEUED = "run.queued"
    RUN_RESUMED = "run.resumed"
    RUN_RELEASED = "run.released"
    RUN_WAITING = "run.waiting"
    RUN_SUSPENDED = "run.suspended"  # an operator parked it at a round boundary (bulk suspend)
    RUN_COMPLETED = "run.completed"
    RUN_FAILED = "run.failed"
    RUN_CANCELLED = "run.cancelled"
    ROUND_STARTED = "round.started"
    TOOL_STARTED = "tool.started"
    TOOL_FINISHED = "tool.finished"
    TOOL_UNAVAILABLE = "tool.unavailable"  # a warning: an MCP server's tools are missing
    CONTEXT_UNCOMPRESSED = "context.uncompressed"  # a warning: a compression failed (L-8)
    PLAN_UPDATED = "plan.updated"
    MESSAGE_ADDED = "message.added"
    MEMORY_READ = "memory.read"  # a run's recall read its long-term memory (shared.engine.memory)
    MEMORY_WRITTEN = "memory.written"  # a run's remember wrote an item there
    MODEL_FAILOVER = "model.failover"  # the run's next call goes to the next profile
    GUARDRAIL_TRIPPED = "guardrail.tripped"  # a guardrail ended the run (docs/guardrails.md)
    RUN_HANDOFF = "run.handoff"  # the run moved to another agent (docs/handoffs.md)
    # live only (the SSE stream, never stored): a reply as it streams
    TEXT_DELTA = "text.delta"
    REASONING_DELTA = "reasoning.delta"
    TOOL_DELTA = "tool.delta"
    TOOL_PROGRESS = "tool.progress"  # a tool's progress as it runs (ctx.progress, HTTP, MCP)


TERMINAL_EVENTS: Final = frozenset(
    {EventType.RUN_COMPLETED, EventType.RUN_FAILED, EventType.RUN_CANCELLED}
)
"""The last event of a run that ended (an SSE stream ends after one)."""
SEGMENT_ENDS: Final = frozenset({EventType.RUN_WAITING, *TERMINAL_EVENTS})
"""The events a stretch of a run's work ends with: it waits for a person, or it ended."""
LIVE_EVENTS: Final = frozenset(
    {EventType.TEXT_DELTA, EventType.REASONING_DELTA, EventType.TOOL_DELTA, EventType.TOOL_PROGRESS}
)
"""Events that are only streamed, never stored."""
MEMORY_EVENTS: Final = frozenset({EventType.MEMORY_READ, EventType.MEMORY_WRITTEN})
"""A run's reads and writes of the tenant's long-term memory (the console lists them)."""


class DeliveryStatus(StrEnum):
    """Where a webhook delivery stands (``webhook_deliveries.status``)."""

    PENDING = "pending"  # due at its next_attempt_at
    SENDING = "sending"  # a sender holds it until lease_until
    DELIVERED = "delivered"
    FAILED = "failed"  # out of tries (TREADLE_WEBHOOK_RETRY_FOR)


DELIVERY_SETTLED: Final = frozenset({DeliveryStatus.DELIVERED, DeliveryStatus.FAILED})


class RoundOutcome(StrEnum):
    """What a round task did (``treadle_rounds{outcome}``, the task span's outcome)."""

    STALE = "stale"  # nothing to claim: a duplicate or out-of-date dispatch
    COMMITTED = "committed"  # the round's change committed
    LOST = "lost"  # the run moved on under the round (a cancel, another worker)
    RETRY = "retry"  # given back, due again later (a transient failure)


class ToolOutcome(StrEnum):
    """What a tool task did."""

    STALE = "stale"
    COMMITTED = "committed"
    LOST = "lost"
