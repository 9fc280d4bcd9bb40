"""Resume, fork and steer: take up a run that ended badly, branch a run at a round, talk to a
run while it works. Each command is one transition (``shared.engine.transition``), read again
and retried while it loses a race; a refused one writes nothing.

- **Resume** (``resume_run``): a ``failed`` or ``cancelled`` run goes on under the same id from
  its last committed checkpoint: its dangling tool calls get a tool message (as a cancel gives
  them), it is queued again, optionally with spec overrides (the new spec is stored and
  ``runs.spec_rev`` bumped, so no process keeps using the old one: ``shared.engine.cache``).
- **Fork** (``fork_run``): a new run whose transcript is the source's up to the end of round N,
  read by reference (``shared.store.lineage``, kind ``fork``): nothing of the source is copied
  or changed. It may add a user message, or answer the ask round N ended with differently.
- **Steer** (``steer_run``): a user message for a waiting or running run. It never lands in the
  middle of a tool batch: while calls are open, or while the run waits, it is kept on the run
  (``runs.steer``) and appended by the transition that queues the run's next round
  (``Tx.apply``, which reads them in its guarded UPDATE), after the batch's tool messages.
  A run with no call open gets it at once: a round not yet taken sees it, a model call in
  flight is superseded (its reply is discarded and the round asks again, with the message).
- **Plan** (``edit_plan``): a waiting run's plan, edited with ``update_plan``'s rules.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.agent import ask as ask_mod
from shared.agent.handoff import handoffs_at
from shared.agent.messages import Message
from shared.agent.plan import Plan, update_plan
from shared.agent.spec import AgentSpec
from shared.agent.state import LoopState
from shared.engine.catalog import build_catalog
from shared.engine.change import Change
from shared.engine.commands import CANCELLED_TEXT, input_messages, repair_calls
from shared.engine.knowledge import check_sources
from shared.engine.runtime import Runtime
from shared.engine.transition import retrying
from shared.engine.tx import Tx
from shared.errors import Conflict, SpecError
from shared.llm.profiles import resolve_profile
from shared.store import calls as call_store
from shared.store import lineage, records
from shared.store import runs as run_store
from shared.store import threads as thread_store
from shared.store.db import reading
from shared.store.rows import RUNNABLE, Run, RunRecord, Status
from shared.vocab import EventType

__all__ = [
    "CANCELLED_TEXT",
    "MAX_STEER",
    "Actor",
    "ForkInput",
    "NewSpec",
    "RESUMABLE",
    "edit_plan",
    "fork_run",
    "merge_spec",
    "resume_run",
    "steer_run",
]

MAX_STEER = 20  # messages waiting on one run at most
RESUMABLE = frozenset({Status.FAILED, Status.CANCELLED})
STEERABLE = frozenset({Status.QUEUED, Status.RUNNING, Status.WAITING})


@dataclass(frozen=True)
class Actor:
    """Who acts, as the events record it: the tenant and its API key (None: auth off)."""

    tenant: str
    key_id: str | None = None

    def as_event(self) -> dict[str, Any]:
        return {"tenant": self.tenant, "key_id": self.key_id}


@dataclass(frozen=True)
class NewSpec:
    """A run's spec with overrides applied: the spec, the overrides as stored (JSON), and the
    spec revision they were applied to (the command refuses if it moved meanwhile)."""

    spec: AgentSpec
    overrides: dict[str, Any]
    rev: int


def merge_spec(current: Mapping[str, Any], overrides: Mapping[str, Any]) -> AgentSpec:
    """The run's spec with ``overrides`` (top-level fields) in place; validated like a
    submitted spec (pydantic: 422 with the field paths). The kind cannot change."""
    if "kind" in overrides and overrides["kind"] != current.get("kind", "agent"):
        raise SpecError("agent.kind: a resumed or forked run keeps its kind")
    return AgentSpec.model_validate({**current, **overrides})


def _check_spec(rt: Runtime, tenant: str, new: NewSpec, inputs: Mapping[str, Any] | None) -> None:
    """What ``submit_run`` checks of a spec, before anything is written: its tools exist, its
    datasets exist for the tenant, and a model named anew is a known profile."""
    build_catalog(new.spec)
    check_sources(rt, tenant, new.spec, inputs or {})
    if "model" in new.overrides:
        resolve_profile(new.spec.model, rt.profiles)


def _spec_json(spec: AgentSpec) -> dict[str, Any]:
    return spec.model_dump(mode="json", exclude_none=True)


# --- resume --------------------------------------------------------------------------------------


def resume_run(rt: Runtime, actor: Actor, run_id: str, new: NewSpec | None = None) -> RunRecord:
    """Take up a failed or cancelled run from its last checkpoint (see the module docstring).
    409 for any other status, for a sub-agent's run (its parent resumes), for a run that never
    started, and on a thread that has moved on (another run is active, or came after it)."""
    if new is not None:
        with reading(rt.engine) as conn:
            record = run_store.get_run(conn, run_id, actor.tenant)
        _check_spec(rt, actor.tenant, new, record.inputs if record is not None else None)

    def op(tx: Tx) -> RunRecord:
        run = tx.run(run_id, actor.tenant)
        _resumable(run)
        if run.thread_id:
            tx.lock_thread(run.thread_id)  # first: lock order
            _thread_allows(tx, run)
        change = repair_calls(tx, run, CANCELLED_TEXT)
        values = change.values
        spec_deadline: float | None = None
        if new is not None:
            if new.rev != run.spec_rev:
                raise Conflict(f"run {run_id}'s spec changed meanwhile; try again")
            run_store.set_agent(tx.conn, run.id, _spec_json(new.spec))
            values["spec_rev"] = run.spec_rev + 1
            spec_deadline = new.spec.budget.deadline_s
        else:
            spec_deadline = AgentSpec.model_validate(
                run_store.run_spec(tx.conn, run.id)[0]
            ).budget.deadline_s
        values.update(
            status=Status.QUEUED.value,
            stop_reason=None,
            result=None,
            error=None,
            pending=None,
            after_join=None,
            open_calls=0,
            lease_owner=None,
            wake_at=None,
            redrives=0,
            attempts=0,  # L-12: a resumed round has its attempts again
            last_error=None,
            deadline_at=tx.ts + spec_deadline if spec_deadline else None,
        )
        change.queue_round = True
        changed = new.overrides if new is not None else {}
        change.event(
            EventType.RUN_RESUMED,
            by=actor.as_event(),
            from_status=run.status.value,
            changed=changed,
        )
        tx.apply(change)
        return tx.record(run_id)

    return retrying(rt, op)


def _resumable(run: Run) -> None:
    if run.status not in RESUMABLE:
        raise Conflict(f"run {run.id} is {run.status}; only a failed or cancelled run resumes")
    if run.parent_run_id is not None:
        raise Conflict(f"run {run.id} is a sub-agent's run: resume its parent {run.parent_run_id}")
    if run.held:
        raise Conflict(f"run {run.id} was cancelled before it started; submit it again")


def _thread_allows(tx: Tx, run: Run) -> None:
    """A thread has one active run, and its history runs in one line: only the thread's last
    started run resumes, and only while the thread is idle."""
    assert run.thread_id is not None
    busy = thread_store.active_run(tx.conn, run.thread_id) or thread_store.next_held(
        tx.conn, run.thread_id
    )
    if busy is not None:
        raise Conflict(f"thread {run.thread_id} is busy with run {busy.id}")
    last = thread_store.last_started(tx.conn, run.thread_id, other_than="")
    if last is not None and last.id != run.id:
        raise Conflict(f"run {last.id} came after run {run.id} on thread {run.thread_id}")


# --- fork ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ForkInput:
    """``POST /v1/runs/{id}/fork``: the round to branch at, and what the branch adds there."""

    round: int
    input: str | list[dict[str, Any]] | None = None
    answers: list[str] | None = None  # another answer to the ask round N ended with
    ask_id: str | None = None
    spec: NewSpec | None = None
    thread_id: str | None = None  # the fork continues this (idle) thread (LangGraph)
    metadata: dict[str, Any] | None = None


@dataclass
class _Point:
    """Where a fork branches: the run whose own messages hold round N, the last seq taken,
    what the fork appends (the other answer) and the plan as round N left it."""

    run: Run
    cut: int
    extra: list[Message] = field(default_factory=list)
    plan: dict[str, Any] | None = None
    handoffs: tuple[str, ...] = ()  # the agent serving at round N (docs/handoffs.md)


def fork_run(rt: Runtime, actor: Actor, run_id: str, req: ForkInput) -> RunRecord:
    """A new run branching ``run_id`` at the end of round ``req.round`` (module docstring)."""
    msgs = _fork_input(req.input)
    new_id = f"run_{uuid.uuid4().hex[:24]}"

    def op(tx: Tx) -> RunRecord:
        source = tx.run(run_id, actor.tenant)
        stamp = _admit_thread(tx, actor.tenant, req.thread_id) if req.thread_id else tx.ts
        if req.round > source.round:
            raise Conflict(f"run {run_id} has {source.round} rounds; it cannot fork at {req.round}")
        point = _point(tx, source, req)
        record = tx.record(source.id)
        spec = req.spec.spec if req.spec is not None else AgentSpec.model_validate(record.agent)
        _create_fork(tx, new_id, actor, source, record, spec, point, req, msgs, stamp)
        return tx.record(new_id)

    if req.spec is not None:
        with reading(rt.engine) as conn:
            found = run_store.get_run(conn, run_id, actor.tenant)
        _check_spec(rt, actor.tenant, req.spec, found.inputs if found is not None else None)
    return retrying(rt, op)


def _fork_input(value: str | list[dict[str, Any]] | None) -> list[Message]:
    return [] if value is None else input_messages(value)


def _admit_thread(tx: Tx, tenant: str, thread_id: str) -> float:
    """A fork that continues a thread: the thread must be idle (it gets one active run)."""
    thread = tx.lock_thread(thread_id, tenant)
    busy = thread_store.active_run(tx.conn, thread_id) or thread_store.next_held(tx.conn, thread_id)
    if busy is not None:
        raise Conflict(f"thread {thread_id} is busy with run {busy.id}")
    return float(thread["updated_at"])


def _point(tx: Tx, source: Run, req: ForkInput) -> _Point:
    """The branch point: round N of the source, or of the run it was itself forked from when
    N comes before the source's own rounds."""
    run = source
    while (
        run.base_kind == lineage.FORK and run.fork_round is not None and req.round < run.fork_round
    ):
        base = run_store.load_run(tx.conn, run.base_run_id or "")
        assert base is not None, f"run {run.id} lost its base"
        run = base
    own = [
        r
        for r in records.own_messages(tx.conn, run.id, run.base_seq + 1)
        if r["round"] <= req.round
    ]
    point = _Point(run, own[-1]["seq"] if own else run.base_seq)
    if req.answers is not None:
        _answered_otherwise(tx, point, own, req)
    _complete(point, own)
    point.plan = _plan_at(tx, run, req.round)
    found = records.list_events_of(tx.conn, run.id, (EventType.RUN_HANDOFF,))
    point.handoffs = handoffs_at([ev["data"] or {} for ev in found], req.round)
    return point


def _answered_otherwise(
    tx: Tx, point: _Point, own: Sequence[Mapping[str, Any]], req: ForkInput
) -> None:
    """Round N ended with an ask: the fork takes the round up to the ask's answer and
    answers it itself (the calls after the ask get the texts they had)."""
    calls = call_store.list_tool_calls(tx.conn, point.run.id, req.round)
    ask = next((c for c in calls if c.name == ask_mod.ASK_USER), None)
    if ask is None:
        raise Conflict(f"round {req.round} of run {point.run.id} did not end with a question")
    if req.ask_id is not None and req.ask_id != ask.call_id:
        raise Conflict(f"round {req.round} asked {ask.call_id}, not {req.ask_id}")
    parsed = ask_mod.parse_ask(ask.arguments)
    if isinstance(parsed, str):
        raise Conflict(f"round {req.round}'s question was invalid: {parsed}")
    later = [c for c in calls if c.idx >= ask.idx]
    answered = {c.call_id for c in later}
    first = next((r for r in own if r["role"] == "tool" and r["tool_call_id"] in answered), None)
    if first is not None:
        point.cut = int(first["seq"]) - 1
    text = ask_mod.render_answer(parsed, list(req.answers or []))
    point.extra = [Message(role="tool", content=text, tool_call_id=ask.call_id, name=ask.name)]
    point.extra += [
        Message(role="tool", content=c.model_text, tool_call_id=c.call_id, name=c.name)
        for c in later
        if c.call_id != ask.call_id
    ]


def _complete(point: _Point, own: Sequence[Mapping[str, Any]]) -> None:
    """Every tool call the branch takes has its result (or the fork's answer gives it)."""
    kept = [r for r in own if r["seq"] <= point.cut]
    called = {c["id"] for r in kept for c in r["tool_calls"] or []}
    answered = {r["tool_call_id"] for r in kept if r["role"] == "tool"}
    answered |= {m.tool_call_id for m in point.extra}
    missing = sorted(called - answered)
    if missing:
        raise Conflict(
            f"run {point.run.id} is not complete at that round: "
            f"no result yet for {', '.join(missing)}"
        )


def _plan_at(tx: Tx, run: Run, round_: int) -> dict[str, Any] | None:
    """The plan as round N left it: the last ``plan.updated`` before round N+1 started."""
    plan: dict[str, Any] | None = None
    for ev in records.list_events_of(
        tx.conn, run.id, (EventType.PLAN_UPDATED, EventType.ROUND_STARTED)
    ):
        data = ev["data"] or {}
        if ev["type"] == EventType.ROUND_STARTED and int(data.get("round") or 0) > round_:
            break
        if ev["type"] == EventType.PLAN_UPDATED:
            plan = data.get("plan")
    return plan


def _create_fork(
    tx: Tx,
    new_id: str,
    actor: Actor,
    source: Run,
    record: RunRecord,
    spec: AgentSpec,
    point: _Point,
    req: ForkInput,
    msgs: list[Message],
    stamp: float,
) -> None:
    chain = lineage.base_chain(tx.conn, point.run.id, point.cut, lineage.FORK)
    view_start = lineage.checkpoint_before(tx.conn, point.run.id, point.cut)
    deadline = spec.budget.deadline_s
    row = {
        "id": new_id,
        "tenant": source.tenant,
        "kind": spec.kind,
        "status": Status.QUEUED.value,
        "thread_id": req.thread_id,
        "webhook": source.webhook,
        "deadline_at": stamp + deadline if deadline else None,
        "base_run_id": source.id,
        "base_seq": point.cut,
        "base_kind": lineage.FORK,
        "fork_round": req.round,
        "round": req.round,
        "loop": LoopState(round=req.round, handoffs=_handoffs(point, req)).to_dict(),
        "plan": point.plan,
        "view_start": view_start,
        "view_tokens": lineage.view_tokens(tx.conn, chain, view_start),
    }
    specs = {
        "agent": _spec_json(spec),
        "inputs": record.inputs,
        "meta": req.metadata if req.metadata is not None else record.meta,
        "warnings": list(build_catalog(spec).warnings) or None,
    }
    tx.rt.store.insert_run(tx.conn, row, specs, [*point.extra, *msgs], stamp)
    run = run_store.load_run(tx.conn, new_id)
    assert run is not None
    change = Change(run, bump=False, queue_round=True)
    link = {"run_id": source.id, "round": req.round}
    change.event(EventType.RUN_QUEUED, kind=spec.kind, forked_from=link, by=actor.as_event())
    if point.plan is not None:
        change.event(EventType.PLAN_UPDATED, plan=point.plan)
    if path := _handoffs(point, req):  # a fork of this fork finds it here
        change.event(
            EventType.RUN_HANDOFF,
            round=req.round,
            to=path[-1],
            path=list(path),
            inherited=True,
            **{"from": None},
        )
    tx.apply(change)


def _handoffs(point: _Point, req: ForkInput) -> tuple[str, ...]:
    """The handoffs a fork starts with: the source's at round N (a fork with a spec of its
    own starts with that spec's agent)."""
    return point.handoffs if req.spec is None else ()


# --- steer ---------------------------------------------------------------------------------------


def steer_run(rt: Runtime, actor: Actor, run_id: str, content: str) -> RunRecord:
    """A user message for a waiting or running run (see the module docstring)."""
    if not content.strip():
        raise SpecError("content must not be empty")

    def op(tx: Tx) -> RunRecord:
        found = tx.run(run_id, actor.tenant)
        if found.status not in STEERABLE or found.held:
            raise Conflict(
                f"run {run_id} is {found.status}; only a waiting or running run takes a message"
            )
        tx.prepare(found, ending=False, tells_parent=False)
        run = run_store.lock_run(tx.conn, run_id)  # the steer list is read and written under it
        assert run is not None
        posted = {"content": content, "at": tx.ts, "by": actor.as_event()}
        event = {"content": content[:300], "by": actor.as_event()}
        if run.status in RUNNABLE and run.open_calls == 0:
            change = _now(run, [*(run.steer or []), posted], event)
        else:
            if len(run.steer or []) >= MAX_STEER:
                raise Conflict(f"run {run_id} already has {MAX_STEER} messages waiting")
            change = Change(run, bump=False, values={"steer": [*(run.steer or []), posted]})
            change.event(EventType.MESSAGE_ADDED, **event, delivered=False)
        tx.apply(change)
        return tx.record(run_id)

    return retrying(rt, op)


def _now(run: Run, posted: list[dict[str, Any]], event: dict[str, Any]) -> Change:
    """No call is open: the messages go in now, before the run's next model request. A round
    taken already (its model call in flight) is superseded: its commit finds the run moved."""
    change = Change(run, queue_round=True)
    for p in posted:
        change.message(Message(role="user", content=p["content"]), run.round)
    change.values.update(steer=None, lease_owner=None, wake_at=None)
    change.event(
        EventType.MESSAGE_ADDED, **event, delivered=True, superseded=run.lease_owner is not None
    )
    return change


# --- plan ----------------------------------------------------------------------------------------


def edit_plan(rt: Runtime, actor: Actor, run_id: str, args: Mapping[str, Any]) -> RunRecord:
    """Edit a waiting run's plan with ``update_plan``'s arguments and rules (422 when the
    tool would refuse them; nothing is kept of a refused edit)."""

    def op(tx: Tx) -> RunRecord:
        run = tx.run(run_id, actor.tenant)
        if run.status != Status.WAITING:
            raise Conflict(f"run {run_id} is {run.status}; only a waiting run's plan is edited")
        if run.plan is None:
            raise Conflict(f"run {run_id} has no plan")
        plan = Plan.from_dict(run.plan)
        new, text = update_plan(plan, json.loads(json.dumps(dict(args))))
        if new is plan or new is None:
            raise SpecError(text)
        change = Change(run, values={"plan": new.to_dict()})
        change.event(EventType.PLAN_UPDATED, plan=new.to_dict(), by=actor.as_event())
        tx.apply(change)
        return tx.record(run_id)

    return retrying(rt, op)
