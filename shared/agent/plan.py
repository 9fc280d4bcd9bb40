"""The planning agent's plan and its two tools, set_plan and update_plan (SPEC P-1..P-6).

Pure and deterministic: the same plan and the same arguments always give the same result,
including the step ids (``s1``, ``s2``, … continuing the count for added steps), so a round
replayed after a crash produces an identical plan.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, get_args

from shared.agent.arguments import ArgumentsError, invalid_arguments_text, parse_arguments

__all__ = [
    "NO_ACTIVE_PLAN",
    "PLANNING_SYSTEM_PROMPT",
    "PLAN_STATUSES",
    "SET_PLAN",
    "SET_PLAN_TOOL",
    "TOOL_DEFS",
    "UPDATE_PLAN",
    "UPDATE_PLAN_TOOL",
    "Plan",
    "PlanStatus",
    "PlanStep",
    "plan_json",
    "render_plan",
    "set_plan",
    "update_plan",
]

PlanStatus = Literal["pending", "in_progress", "done", "blocked", "skipped"]
PLAN_STATUSES: tuple[PlanStatus, ...] = get_args(PlanStatus)

SET_PLAN = "set_plan"
UPDATE_PLAN = "update_plan"

NO_ACTIVE_PLAN = "No active plan. Call set_plan first."
_NEED_ONE = "provide updates, add_steps, or both"

_STEP_ID = re.compile(r"^s(\d+)$")


@dataclass(frozen=True, slots=True)
class PlanStep:
    id: str
    name: str
    status: PlanStatus = "pending"
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "status": self.status, "note": self.note}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PlanStep:
        status = _norm_status(d.get("status")) or "pending"
        note = d.get("note")
        return cls(
            id=str(d["id"]),
            name=str(d.get("name", "")),
            status=status,
            note=None if note is None else str(note),
        )


@dataclass(frozen=True, slots=True)
class Plan:
    """The active plan (SPEC P-1). Immutable: tools return a new plan."""

    name: str
    steps: tuple[PlanStep, ...]

    @property
    def finished(self) -> bool:
        """Every step is done or skipped (a blocked step keeps the plan unfinished)."""
        return all(s.status in ("done", "skipped") for s in self.steps)

    def counts(self) -> dict[PlanStatus, int]:
        """How many steps have each status, in ``PLAN_STATUSES`` order."""
        out: dict[PlanStatus, int] = dict.fromkeys(PLAN_STATUSES, 0)
        for step in self.steps:
            out[step.status] += 1
        return out

    def step(self, step_id: str) -> PlanStep | None:
        return next((s for s in self.steps if s.id == step_id), None)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "steps": [s.to_dict() for s in self.steps]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Plan:
        return cls(
            name=str(d.get("name", "")),
            steps=tuple(PlanStep.from_dict(s) for s in d.get("steps") or ()),
        )


SET_PLAN_TOOL: dict[str, Any] = {
    "name": SET_PLAN,
    "description": (
        "Create the plan for a multi-step task: a short name and the ordered steps. "
        "Replaces any previous plan; every step starts pending and gets a short id "
        "(s1, s2, ...). Do not call it again while a plan is active: use update_plan."
    ),
    "parameters": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "A short name for the plan."},
            "steps": {
                "type": "array",
                "items": {"type": "string"},
                "minItems": 1,
                "description": "The steps, in order, each a short imperative sentence.",
            },
        },
        "required": ["name", "steps"],
    },
}

UPDATE_PLAN_TOOL: dict[str, Any] = {
    "name": UPDATE_PLAN,
    "description": (
        "Update the active plan: change the status (and note) of steps by id, and/or append "
        "new steps. The whole call fails, changing nothing, if any step id is unknown. "
        "Statuses: pending, in_progress, done, blocked, skipped."
    ),
    "parameters": {
        "type": "object",
        "properties": {
            "updates": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "string", "description": "The step id, e.g. s2."},
                        "status": {"type": "string", "enum": list(PLAN_STATUSES)},
                        "note": {
                            "type": ["string", "null"],
                            "description": "A short note; null clears it, omit to keep it.",
                        },
                    },
                    "required": ["id", "status"],
                },
            },
            "add_steps": {
                "type": "array",
                "items": {"type": "string"},
                "minItems": 1,
                "description": "New steps appended to the end, pending.",
            },
        },
    },
}

TOOL_DEFS: tuple[dict[str, Any], ...] = (SET_PLAN_TOOL, UPDATE_PLAN_TOOL)
"""Both plan tools, in the order they are offered to the model."""

PLANNING_SYSTEM_PROMPT = """\
You can keep a plan with the set_plan and update_plan tools.
- Plan only for tasks that need several steps; answer simple requests directly, with no plan.
- If the user asks for a plan, call set_plan first, before any other tool.
- While a plan is active, do not call set_plan again: use update_plan to mark steps \
in_progress, done, blocked or skipped, to add notes, and to append steps you discover.
- Keep the plan current as you work; pending steps do not stop you from giving the final \
answer when the task is complete.
- Ask the user (ask_user) only for hard blockers: missing required input, an unavailable \
tool, or an unclear goal. Otherwise make a reasonable assumption, state it, and go on."""


def plan_json(plan: Plan) -> str:
    """The plan as compact JSON (for a context checkpoint, SPEC L-8/P-4)."""
    return json.dumps(plan.to_dict(), ensure_ascii=False, separators=(",", ":"))


def render_plan(plan: Plan) -> str:
    """SPEC P-4: a summary line, progress counts, then one line per step."""
    counts = plan.counts()
    total = len(plan.steps)
    state = "finished" if plan.finished else "active"
    lines = [
        f'Plan "{plan.name}": {total} step(s), {state}.',
        (
            f"Plan progress: {counts['done']} done, {counts['in_progress']} in progress, "
            f"{counts['pending']} pending, {counts['blocked']} blocked, "
            f"{counts['skipped']} skipped."
        ),
        "Current plan steps:",
    ]
    lines.extend(
        f"- {s.id}: {s.name} | status={s.status} | note={s.note or ''}" for s in plan.steps
    )
    return "\n".join(lines)


def set_plan(plan: Plan | None, args: Mapping[str, Any] | str) -> tuple[Plan | None, str]:
    """SPEC P-1: replace any plan with a new one, all steps pending, ids s1..sN.

    Returns ``(new_plan, tool_result)``; on invalid arguments ``(plan, message)`` with the
    given plan unchanged (the same object).
    """
    parsed = _as_mapping(SET_PLAN, args)
    if isinstance(parsed, str):
        return plan, parsed
    name = parsed.get("name")
    if not isinstance(name, str) or not name.strip():
        return plan, invalid_arguments_text(SET_PLAN, "'name' must be a non-empty string")
    steps = _step_names(parsed.get("steps"), "steps")
    if isinstance(steps, str):
        return plan, invalid_arguments_text(SET_PLAN, steps)
    new = Plan(
        name=name.strip(),
        steps=tuple(PlanStep(id=f"s{i}", name=n) for i, n in enumerate(steps, start=1)),
    )
    head = f'Set active plan "{new.name}" with {len(new.steps)} step(s).'
    return new, f"{head}\n{render_plan(new)}"


def update_plan(plan: Plan | None, args: Mapping[str, Any] | str) -> tuple[Plan | None, str]:
    """SPEC P-1/P-3: apply status/note updates and appended steps atomically.

    Returns ``(new_plan, tool_result)`` on success. On any failure (no plan, invalid
    arguments, unknown step id) returns ``(plan, message)`` with the given plan unchanged:
    nothing of the call is kept.
    """
    if plan is None:
        return None, NO_ACTIVE_PLAN
    asked = _update_args(args)
    if isinstance(asked, str):
        return plan, asked
    updates, added = asked
    new = _updated(plan, updates, added)
    if isinstance(new, str):
        return plan, new
    heads: list[str] = []
    if updates:
        heads.append(f"Updated {len(updates)} plan step(s).")
    if added:
        heads.append("Added plan step(s): " + ", ".join(f'"{n}"' for n in added) + ".")
    return new, " ".join(heads) + "\n" + render_plan(new)


def _update_args(args: Mapping[str, Any] | str) -> tuple[list[_Update], list[str]] | str:
    """The call's step updates and the names of the steps it adds, or the tool result that
    says why the arguments are invalid."""
    parsed = _as_mapping(UPDATE_PLAN, args)
    if isinstance(parsed, str):
        return parsed
    updates = _updates(parsed.get("updates"))
    if isinstance(updates, str):
        return invalid_arguments_text(UPDATE_PLAN, updates)
    added: list[str] = []
    if parsed.get("add_steps") not in (None, []):
        names = _step_names(parsed.get("add_steps"), "add_steps")
        if isinstance(names, str):
            return invalid_arguments_text(UPDATE_PLAN, names)
        added = names
    if not updates and not added:
        return invalid_arguments_text(UPDATE_PLAN, _NEED_ONE)
    return updates, added


def _updated(plan: Plan, updates: list[_Update], added: list[str]) -> Plan | str:
    """The plan with the updates applied and the steps added, or the tool result naming an
    unknown step."""
    steps = list(plan.steps)
    index = {s.id: i for i, s in enumerate(steps)}
    for step_id, status, has_note, note in updates:
        if step_id not in index:
            return f"Unknown plan step: {step_id}"
        i = index[step_id]
        step = steps[i]
        steps[i] = replace(
            step,
            status=status or step.status,
            note=note if has_note else step.note,
        )
    next_no = _next_step_number(steps)
    for offset, name in enumerate(added):
        steps.append(PlanStep(id=f"s{next_no + offset}", name=name))
    return Plan(name=plan.name, steps=tuple(steps))


# --- argument helpers -------------------------------------------------------------------

_Update = tuple[str, PlanStatus | None, bool, str | None]


def _as_mapping(tool: str, args: Mapping[str, Any] | str) -> Mapping[str, Any] | str:
    if isinstance(args, str):
        try:
            return parse_arguments(args)
        except ArgumentsError as exc:
            return invalid_arguments_text(tool, str(exc))
    if not isinstance(args, Mapping):
        return invalid_arguments_text(tool, "expected a JSON object")
    return args


def _step_names(value: Any, field: str) -> list[str] | str:
    """A list of non-empty step names; a step given as ``{"name": ...}`` is accepted too."""
    if not isinstance(value, list) or not value:
        return f"'{field}' must be a non-empty array of strings"
    names: list[str] = []
    for i, item in enumerate(value):
        if isinstance(item, Mapping):
            item = item.get("name", item.get("title"))
        if not isinstance(item, str) or not item.strip():
            return f"'{field}[{i}]' must be a non-empty string"
        names.append(item.strip())
    return names


def _updates(value: Any) -> list[_Update] | str:
    if value is None:
        return []
    if not isinstance(value, list):
        return "'updates' must be an array"
    out: list[_Update] = []
    for i, item in enumerate(value):
        where = f"updates[{i}]"
        if not isinstance(item, Mapping):
            return f"'{where}' must be an object"
        step_id = item.get("id")
        if isinstance(step_id, int) and not isinstance(step_id, bool):
            step_id = f"s{step_id}"  # a bare step number
        if not isinstance(step_id, str) or not step_id.strip():
            return f"'{where}.id' must be a non-empty string"
        raw_status = item.get("status")
        status = _norm_status(raw_status)
        if raw_status is not None and status is None:
            return f"'{where}.status' must be one of: {', '.join(PLAN_STATUSES)}"
        has_note = "note" in item
        note = item.get("note")
        if note is not None and not isinstance(note, str):
            note = json.dumps(note, ensure_ascii=False)
        if status is None and not has_note:
            return f"'{where}.status' is required"
        out.append((step_id.strip(), status, has_note, note))
    return out


def _norm_status(value: Any) -> PlanStatus | None:
    if not isinstance(value, str):
        return None
    key = re.sub(r"[\s-]+", "_", value.strip().lower())
    aliases = {"completed": "done", "complete": "done", "finished": "done"}
    key = aliases.get(key, key)
    for status in PLAN_STATUSES:
        if status == key:
            return status
    return None


def _next_step_number(steps: Sequence[PlanStep]) -> int:
    numbers = [int(m.group(1)) for s in steps if (m := _STEP_ID.match(s.id))]
    return max([len(steps), *numbers]) + 1
