"""The routes that take a run up again, branch it, or talk to it while it works
(docs/api.md, "Resume, fork and steer"): resume, fork, messages, plan. The engine side is
``shared.engine.lifecycle``; here are the bodies, the caller's tenant and the limits a new or
resumed run is held to, checked before anything is written."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from scheduler.http import limits
from scheduler.http.agents import resolve_agent
from scheduler.http.auth import Caller, WriteCaller
from scheduler.http.deps import RuntimeDep
from scheduler.http.errors import ApiError
from scheduler.http.routing import api_router
from scheduler.http.schemas import InputMessage, PathId, RunView, run_view
from shared.agent.spec import AgentSpec
from shared.engine import lifecycle
from shared.engine.runtime import Runtime
from shared.errors import NotFound
from shared.store import runs as run_store
from shared.store.db import reading
from shared.store.rows import RunRecord

__all__ = ["ForkBody", "PlanBody", "ResumeBody", "SteerBody", "router"]

SpecOverrides = dict[str, Any]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ResumeBody(_Strict):
    agent: SpecOverrides | None = Field(
        default=None,
        description='Fields of the run\'s agent spec to override, e.g. {"model": "backup"}',
    )


class ForkAnswer(_Strict):
    answers: list[str] = Field(max_length=3)
    ask_id: str | None = Field(default=None, min_length=1, max_length=200)


class ForkBody(_Strict):
    round: int = Field(ge=0, le=1_000_000, description="Branch at the end of this round")
    input: str | list[InputMessage] | None = Field(
        default=None, description="A user message (or messages) the branch adds at that point"
    )
    answer: ForkAnswer | None = Field(
        default=None, description="Another answer to the question round N ended with"
    )
    agent: SpecOverrides | None = None
    metadata: dict[str, Any] | None = None


class SteerBody(_Strict):
    content: str = Field(min_length=1, description="A user message for the run's next request")


class PlanBody(_Strict):
    """``update_plan``'s arguments: step updates by id, and steps to append."""

    updates: list[dict[str, Any]] | None = Field(default=None, max_length=200)
    add_steps: list[str] | None = Field(default=None, max_length=200)


def _actor(caller: Caller) -> lifecycle.Actor:
    return lifecycle.Actor(caller.tenant, caller.key_id)


def _own(rt: Runtime, caller: Caller, run_id: str) -> RunRecord:
    with reading(rt.engine) as conn:
        record = run_store.get_run(conn, run_id, caller.tenant)
    if record is None:
        raise NotFound(f"run {run_id} not found")
    return record


def _new_spec(
    rt: Runtime, caller: Caller, record: RunRecord, overrides: SpecOverrides
) -> lifecycle.NewSpec:
    """The run's spec with the overrides, checked as a submitted spec is (422, 413)."""
    spec = resolve_agent(lifecycle.merge_spec(record.agent, overrides))
    limits.check_size(rt.settings, spec, "")
    limits.police_spec(rt, caller, spec)
    return lifecycle.NewSpec(spec, dict(overrides), record.run.spec_rev)


def _input(body: ForkBody) -> str | list[dict[str, Any]] | None:
    if body.input is None or isinstance(body.input, str):
        return body.input
    return [m.model_dump() for m in body.input]


router = api_router(prefix="/v1", tags=["runs"])


@router.post("/runs/{run_id}/resume", response_model=RunView)
def resume(
    run_id: PathId, rt: RuntimeDep, caller: WriteCaller, body: ResumeBody | None = None
) -> RunView:
    """Take up a failed or cancelled run from its last checkpoint, under the same id,
    optionally with spec overrides. 409 for any other status."""
    record = _own(rt, caller, run_id)
    new = _new_spec(rt, caller, record, body.agent) if body and body.agent else None
    if record.run.status in lifecycle.RESUMABLE:  # it will be in flight again
        limits.check_in_flight(rt, caller.tenant)
    return run_view(lifecycle.resume_run(rt, _actor(caller), run_id, new))


@router.post("/runs/{run_id}/fork", status_code=201, response_model=RunView)
def fork(run_id: PathId, body: ForkBody, rt: RuntimeDep, caller: WriteCaller) -> RunView:
    """A new run whose history is this run's up to the end of round N (shared, not
    copied), plus a new user message or another answer to round N's question."""
    record = _own(rt, caller, run_id)
    new = _new_spec(rt, caller, record, body.agent) if body.agent else None
    spec = new.spec if new is not None else AgentSpec.model_validate(record.agent)
    limits.check_size(rt.settings, spec, _input(body) or "")
    limits.check_rate(rt, caller.limit_key)  # a fork is a new run, as a submission is
    limits.check_in_flight(rt, caller.tenant)
    req = lifecycle.ForkInput(
        round=body.round,
        input=_input(body),
        answers=body.answer.answers if body.answer else None,
        ask_id=body.answer.ask_id if body.answer else None,
        spec=new,
        metadata=body.metadata,
    )
    return run_view(lifecycle.fork_run(rt, _actor(caller), run_id, req))


@router.post("/runs/{run_id}/messages", response_model=RunView)
def steer(run_id: PathId, body: SteerBody, rt: RuntimeDep, caller: WriteCaller) -> RunView:
    """A user message for a waiting or running run: in its next model request, after the
    tool messages of a batch under way."""
    if len(body.content) > rt.settings.max_input_chars:
        raise ApiError(
            413,
            "too_large",
            f"content of {len(body.content)} characters is over the limit of "
            f"{rt.settings.max_input_chars} (TREADLE_MAX_INPUT_CHARS)",
        )
    return run_view(lifecycle.steer_run(rt, _actor(caller), run_id, body.content))


@router.patch("/runs/{run_id}/plan", response_model=RunView)
def plan(run_id: PathId, body: PlanBody, rt: RuntimeDep, caller: WriteCaller) -> RunView:
    """Edit a waiting run's plan with ``update_plan``'s arguments and rules."""
    args = body.model_dump(exclude_none=True)
    return run_view(lifecycle.edit_plan(rt, _actor(caller), run_id, args))
