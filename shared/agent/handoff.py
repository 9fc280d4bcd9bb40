"""Handoffs (docs/handoffs.md): the pure part. Which agent serves a run (the submitted spec,
walked down the handoffs its loop state records), the ``transfer_to_<name>`` tools the model
sees, which transfer a round took, and what the new agent's model sees of the transcript."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from shared.agent.messages import Message
from shared.agent.spec import AgentSpec, HandoffSpec
from shared.agent.state import CatalogEntry, LoopState

__all__ = [
    "SKIPPED_SECOND_HANDOFF",
    "TRANSFER_PREFIX",
    "active_spec",
    "handoff_of",
    "handoffs_at",
    "serving",
    "taken_handoff",
    "transfer_entries",
    "transfer_text",
    "view_for",
]

TRANSFER_PREFIX = "transfer_to_"
SKIPPED_SECOND_HANDOFF = "Skipped: the run was already handed off by an earlier call."


def active_spec(root: AgentSpec, path: Sequence[str]) -> AgentSpec:
    """The spec that serves a run submitted with ``root`` after the handoffs ``path``."""
    spec = root
    for name in path:
        found = handoff_of(spec, TRANSFER_PREFIX + name)
        if found is None:
            raise ValueError(f"handoff {name!r} is not in the spec that took it")
        spec = found.spec
    return spec


def serving(root: AgentSpec, loop: Mapping[str, Any] | None) -> AgentSpec:
    """``active_spec`` for a run's stored loop state."""
    path = (loop or {}).get("handoffs") or ()
    return active_spec(root, tuple(path)) if path else root


def handoff_of(spec: AgentSpec, tool_name: str) -> HandoffSpec | None:
    """The handoff a ``transfer_to_<name>`` tool takes (the first of that name)."""
    if not tool_name.startswith(TRANSFER_PREFIX):
        return None
    name = tool_name.removeprefix(TRANSFER_PREFIX)
    return next((h for h in spec.handoffs if h.name == name), None)


def transfer_text(h: HandoffSpec) -> str:
    """The transfer tool's result (the tool message the new agent's model sees)."""
    return f"Transferred to {h.name}. The {h.name} agent takes over the conversation from here."


def transfer_entries(spec: AgentSpec) -> list[CatalogEntry]:
    """The transfer tools of ``spec``'s handoffs, as the model sees them (internal: the step
    runs them; read-only: no approval)."""
    seen: set[str] = set()
    out = []
    for h in spec.handoffs:
        if h.name in seen:
            continue
        seen.add(h.name)
        text = h.description or f"Hand the conversation over to the {h.name} agent."
        out.append(
            CatalogEntry(
                name=h.tool_name,
                description=text,
                parameters={"type": "object", "properties": {}},
                read_only=True,
                internal=True,
            )
        )
    return out


def taken_handoff(
    spec: AgentSpec, calls: Iterable[Any], state: LoopState
) -> tuple[LoopState, HandoffSpec | None]:
    """The loop state after a round's calls (``PlannedCall``s): the first transfer the step
    ran (its result is ``transfer_text``) moves the run to that agent from the next round."""
    for c in calls:
        h = handoff_of(spec, c.name)
        if h is not None and c.status == "done" and c.result == transfer_text(h):
            moved = replace(state, handoffs=(*state.handoffs, h.name))
            return replace(moved, profile_index=0, failover_at=None), h  # its own model
    return state, None


def view_for(root: AgentSpec, path: Sequence[str], messages: list[Message]) -> list[Message]:
    """What the serving agent's model sees of the transcript: all of it, or, when the last
    handoff says ``drop_tools``, the messages without tool calls and results."""
    if not path:
        return messages
    parent = active_spec(root, tuple(path[:-1]))
    h = handoff_of(parent, TRANSFER_PREFIX + path[-1])
    if h is None or h.input_filter != "drop_tools":
        return messages
    ids = {c.id for m in messages for c in m.tool_calls if c.name == h.tool_name}
    answered = [i for i, m in enumerate(messages) if m.role == "tool" and m.tool_call_id in ids]
    if not answered:  # the handoff is not in the view (a context checkpoint summed it up)
        return messages
    cut = answered[-1] + 1  # what came before the handoff, without its tool traffic
    return [*_without_tools(messages[:cut]), *messages[cut:]]


def _without_tools(messages: Sequence[Message]) -> list[Message]:
    out = []
    for m in messages:
        if m.role == "tool":
            continue
        if m.tool_calls:
            if not m.text.strip():
                continue
            m = replace(m, tool_calls=())
        out.append(m)
    return out


def handoffs_at(events: Iterable[Mapping[str, Any]], round_: int) -> tuple[str, ...]:
    """The handoffs a run had taken by the end of round ``round_`` (its ``run.handoff``
    events' data, in order): a fork there starts with them."""
    path: tuple[str, ...] = ()
    for data in events:
        if int(data.get("round") or 0) <= round_:
            path = tuple(data.get("path") or ())
    return path
