"""Plans: set_plan / update_plan, atomic updates, rendering (SPEC P-1..P-6)."""

from __future__ import annotations

import json

import pytest

from shared.agent.arguments import validate_against_schema
from shared.agent.plan import (
    NO_ACTIVE_PLAN,
    PLAN_STATUSES,
    PLANNING_SYSTEM_PROMPT,
    SET_PLAN_TOOL,
    TOOL_DEFS,
    UPDATE_PLAN_TOOL,
    Plan,
    PlanStep,
    plan_json,
    render_plan,
    set_plan,
    update_plan,
)


def _plan(*names: str) -> Plan:
    plan, _ = set_plan(None, {"name": "Trip", "steps": list(names)})
    assert plan is not None
    return plan


# SPEC P-1: set_plan


def test_set_plan_creates_pending_steps_with_short_ids() -> None:
    plan, text = set_plan(None, {"name": "Trip", "steps": ["Book flights", "Book hotel"]})
    assert plan == Plan(
        name="Trip",
        steps=(PlanStep("s1", "Book flights"), PlanStep("s2", "Book hotel")),
    )
    assert text.startswith('Set active plan "Trip" with 2 step(s).')
    assert "- s1: Book flights | status=pending | note=" in text


def test_set_plan_replaces_an_existing_plan() -> None:
    old, _ = update_plan(_plan("a", "b", "c"), {"updates": [{"id": "s1", "status": "done"}]})
    assert old is not None
    new, _ = set_plan(old, {"name": "Other", "steps": ["x"]})
    assert new is not None
    assert new.name == "Other"
    assert new.steps == (PlanStep("s1", "x"),)


def test_ids_are_deterministic_for_replay() -> None:
    # the loop is replayed after crashes: same input, same ids
    args = {"name": "Trip", "steps": ["a", "b"]}
    assert set_plan(None, args) == set_plan(None, args)
    plan = _plan("a", "b")
    update = {"add_steps": ["c", "d"]}
    first = update_plan(plan, update)
    assert first == update_plan(plan, update)
    assert first[0] is not None
    assert [s.id for s in first[0].steps] == ["s1", "s2", "s3", "s4"]


def test_set_plan_accepts_raw_json_text() -> None:
    plan, _ = set_plan(None, '{"name": "T", "steps": ["one",]}')
    assert plan is not None and plan.steps[0].name == "one"


@pytest.mark.parametrize(
    "args",
    [
        {"steps": ["a"]},
        {"name": "", "steps": ["a"]},
        {"name": "T"},
        {"name": "T", "steps": []},
        {"name": "T", "steps": ["a", ""]},
        {"name": "T", "steps": "a"},
    ],
)
def test_set_plan_invalid_arguments_keep_the_old_plan(args: dict[str, object]) -> None:
    # SPEC P-3: invalid arguments -> the validation message, nothing changes
    old = _plan("a")
    plan, text = set_plan(old, args)
    assert plan is old
    assert text.startswith("Invalid arguments for set_plan: ")


def test_set_plan_unparseable_text() -> None:
    plan, text = set_plan(None, "not json")
    assert plan is None
    assert text.startswith("Invalid arguments for set_plan: ")


# SPEC P-1/P-2: update_plan


def test_update_status_and_note() -> None:
    plan = _plan("a", "b")
    new, text = update_plan(plan, {"updates": [{"id": "s2", "status": "in_progress", "note": "n"}]})
    assert new is not None
    assert new.steps[1] == PlanStep("s2", "b", "in_progress", "n")
    assert new.steps[0] == plan.steps[0]
    assert text.startswith("Updated 1 plan step(s).")
    assert "- s2: b | status=in_progress | note=n" in text


@pytest.mark.parametrize("start", PLAN_STATUSES)
@pytest.mark.parametrize("target", PLAN_STATUSES)
def test_any_transition_is_allowed(start: str, target: str) -> None:
    # SPEC P-2
    plan = _plan("a")
    plan1, _ = update_plan(plan, {"updates": [{"id": "s1", "status": start}]})
    plan2, text = update_plan(plan1, {"updates": [{"id": "s1", "status": target}]})
    assert plan2 is not None and plan2.steps[0].status == target, text


def test_add_steps_continue_the_count() -> None:
    plan = _plan("a", "b")
    new, text = update_plan(plan, {"add_steps": ["c"]})
    assert new is not None
    assert new.steps[-1] == PlanStep("s3", "c")
    assert 'Added plan step(s): "c".' in text
    newer, _ = update_plan(new, {"add_steps": ["d", "e"]})
    assert newer is not None
    assert [s.id for s in newer.steps] == ["s1", "s2", "s3", "s4", "s5"]


def test_updates_and_add_steps_together() -> None:
    new, text = update_plan(
        _plan("a"), {"updates": [{"id": "s1", "status": "done"}], "add_steps": ["b"]}
    )
    assert new is not None
    assert [(s.id, s.status) for s in new.steps] == [("s1", "done"), ("s2", "pending")]
    assert text.splitlines()[0] == 'Updated 1 plan step(s). Added plan step(s): "b".'


def test_updates_apply_in_order() -> None:
    new, _ = update_plan(
        _plan("a"),
        {"updates": [{"id": "s1", "status": "done"}, {"id": "s1", "status": "blocked"}]},
    )
    assert new is not None and new.steps[0].status == "blocked"


# SPEC P-3: atomic update


def test_unknown_step_fails_the_whole_call_and_changes_nothing() -> None:
    plan = _plan("a", "b")
    before = plan.to_dict()
    new, text = update_plan(
        plan,
        {
            "updates": [
                {"id": "s1", "status": "done", "note": "first"},
                {"id": "s9", "status": "done"},
                {"id": "s2", "status": "done"},
            ],
            "add_steps": ["c"],
        },
    )
    assert text == "Unknown plan step: s9"
    assert new is plan
    assert plan.to_dict() == before  # no update and no added step was kept


def test_no_plan_yet() -> None:
    assert update_plan(None, {"add_steps": ["a"]}) == (None, NO_ACTIVE_PLAN)
    assert NO_ACTIVE_PLAN == "No active plan. Call set_plan first."


@pytest.mark.parametrize(
    "args",
    [
        {},
        {"updates": [], "add_steps": []},
        {"updates": "s1"},
        {"updates": [{"status": "done"}]},
        {"updates": [{"id": "s1", "status": "finished-ish"}]},
        {"updates": [{"id": "s1"}]},
        {"add_steps": [""]},
    ],
)
def test_invalid_update_arguments_change_nothing(args: dict[str, object]) -> None:
    plan = _plan("a")
    new, text = update_plan(plan, args)
    assert new is plan
    assert text.startswith("Invalid arguments for update_plan: ")


def test_note_given_overwrites_even_null_omitted_keeps() -> None:
    plan, _ = update_plan(_plan("a"), {"updates": [{"id": "s1", "status": "done", "note": "x"}]})
    kept, _ = update_plan(plan, {"updates": [{"id": "s1", "status": "blocked"}]})
    assert kept is not None and kept.steps[0].note == "x"
    cleared, _ = update_plan(kept, {"updates": [{"id": "s1", "status": "blocked", "note": None}]})
    assert cleared is not None and cleared.steps[0].note is None
    replaced, _ = update_plan(kept, {"updates": [{"id": "s1", "status": "done", "note": "y"}]})
    assert replaced is not None and replaced.steps[0].note == "y"


def test_status_spelling_is_tolerated() -> None:
    new, _ = update_plan(_plan("a"), {"updates": [{"id": "s1", "status": "In Progress"}]})
    assert new is not None and new.steps[0].status == "in_progress"


# SPEC P-4: what the model sees


def test_render_plan_lines() -> None:
    plan, _ = update_plan(
        _plan("a", "b", "c", "d", "e"),
        {
            "updates": [
                {"id": "s1", "status": "done", "note": "ok"},
                {"id": "s2", "status": "in_progress"},
                {"id": "s4", "status": "blocked", "note": "needs key"},
                {"id": "s5", "status": "skipped"},
            ]
        },
    )
    assert plan is not None
    lines = render_plan(plan).splitlines()
    assert lines[0] == 'Plan "Trip": 5 step(s), active.'
    assert lines[1] == "Plan progress: 1 done, 1 in progress, 1 pending, 1 blocked, 1 skipped."
    assert lines[2] == "Current plan steps:"
    assert lines[3:] == [
        "- s1: a | status=done | note=ok",
        "- s2: b | status=in_progress | note=",
        "- s3: c | status=pending | note=",
        "- s4: d | status=blocked | note=needs key",
        "- s5: e | status=skipped | note=",
    ]


def test_finished_means_done_or_skipped() -> None:
    plan, _ = update_plan(
        _plan("a", "b"),
        {"updates": [{"id": "s1", "status": "done"}, {"id": "s2", "status": "skipped"}]},
    )
    assert plan is not None and plan.finished
    assert "finished" in render_plan(plan).splitlines()[0]
    blocked, _ = update_plan(plan, {"updates": [{"id": "s2", "status": "blocked"}]})
    assert blocked is not None and not blocked.finished


def test_round_trip_and_json() -> None:
    plan, _ = update_plan(_plan("a", "中文"), {"updates": [{"id": "s2", "status": "done"}]})
    assert plan is not None
    assert Plan.from_dict(plan.to_dict()) == plan
    assert Plan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    assert json.loads(plan_json(plan)) == plan.to_dict()
    assert "中文" in plan_json(plan)


def test_plan_is_frozen() -> None:
    plan = _plan("a")
    with pytest.raises(AttributeError):
        plan.name = "x"  # type: ignore[misc]


# tool definitions and prompt (SPEC P-1, P-6)


def test_tool_definitions_are_data() -> None:
    assert [d["name"] for d in TOOL_DEFS] == ["set_plan", "update_plan"]
    for tool in (SET_PLAN_TOOL, UPDATE_PLAN_TOOL):
        assert set(tool) == {"name", "description", "parameters"}
        assert tool["parameters"]["type"] == "object"
        json.dumps(tool)
    # the schemas agree with the tools: a valid call passes the generic check (SPEC L-5)
    good_set = {"name": "T", "steps": ["a"]}
    good_update = {"updates": [{"id": "s1", "status": "done", "note": None}], "add_steps": ["b"]}
    assert validate_against_schema(good_set, SET_PLAN_TOOL["parameters"]) is None
    assert validate_against_schema(good_update, UPDATE_PLAN_TOOL["parameters"]) is None
    status_enum = UPDATE_PLAN_TOOL["parameters"]["properties"]["updates"]["items"]["properties"][
        "status"
    ]["enum"]
    assert status_enum == list(PLAN_STATUSES)


def test_planning_prompt_says_what_p6_requires() -> None:
    # SPEC P-6
    text = PLANNING_SYSTEM_PROMPT
    assert "multi" in text or "several steps" in text
    assert "set_plan first" in text
    assert "do not call set_plan again" in text
    assert "hard blockers" in text
