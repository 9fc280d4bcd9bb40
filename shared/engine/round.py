"""One round: claim → budget → request → model → step → one commit → dispatch.

The claim and the commit are transitions (``shared.engine.transition``); between them the
worker holds the round by its heartbeat lease, with no transaction open, while the model
streams. A stale or duplicate dispatch finds nothing to claim and is dropped.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy.exc import DataError, IntegrityError

from shared.agent.attachments import attachment_refs
from shared.agent.budget import check_budgets
from shared.agent.chat import stream_enabled
from shared.agent.compression import (
    checkpoint_message,
    checkpoint_request_messages,
    clean_checkpoint_summary,
    compression_due,
    compression_retry_at,
    needs_checkpoint,
    reduce_tool_result,
    tool_result_budget,
)
from shared.agent.decisions import Continue, Fail, Finish, RunTools
from shared.agent.guardrails import (
    GUARDRAIL_STOP,
    pending_input,
    tool_call_text,
    tripped_finish,
    with_passed,
)
from shared.agent.handoff import view_for
from shared.agent.history import request_budget
from shared.agent.messages import Message, Reply, Usage
from shared.agent.plan import Plan
from shared.agent.pricing import call_usage, price_call
from shared.agent.request import RequestPlan, last_user_text, plan_request
from shared.agent.router import route
from shared.agent.sanitize import sanitize_reply
from shared.agent.spec import AgentSpec, ModelProfile
from shared.agent.state import LoopState
from shared.agent.step import StepResult, step
from shared.engine import children, failover, failure, metrics, outage, spend, toolkit
from shared.engine.attachments import request_inputs
from shared.engine.busy import when_free
from shared.engine.catalog import DEFER_S, Catalog, with_unavailable_note
from shared.engine.change import Change, encode_after, finish_events, flush, settle
from shared.engine.gate import Stage
from shared.engine.guardrails import Checked, run_guardrails
from shared.engine.handlers import run_handler
from shared.engine.join import finish_call
from shared.engine.knowledge import with_dataset_quotes
from shared.engine.runtime import Dispatch, Publisher, Runtime
from shared.engine.toolrun import execute_tool, finished, runs_in_round
from shared.engine.transition import attempt, transaction
from shared.engine.tx import Tx
from shared.errors import (
    Aborted,
    BrokenStream,
    DeadlineExceeded,
    FatalModelError,
    TransientModelError,
)
from shared.llm.abort import Abort
from shared.llm.backoff import backoff_delay
from shared.llm.base import Delta, ModelRequest, ToolDef
from shared.llm.profiles import make_model
from shared.llm.ratelimit import Limits, Permit, limit_key, limits_of
from shared.store import calls as call_store
from shared.store import records
from shared.store import runs as run_store
from shared.store.db import reading
from shared.store.rows import Call, CallStatus, Run
from shared.store.spend import Envelope
from shared.store.write import ROUND_STARTED, Inc, round_started
from shared.tools import ToolResult
from shared.vocab import EventType, Status

__all__ = ["RoundResult", "rounds_in_place", "run_round"]

log = logging.getLogger("treadle.round")


@dataclass(frozen=True)
class RoundResult:
    status: str  # stale | committed | lost | retry
    detail: str = ""
    kind: str | None = None


@dataclass
class _Claim:
    run: Run
    spec: AgentSpec
    inputs: dict[str, Any]
    profile: ModelProfile
    state: LoopState
    history: list[Message]
    owner: str
    due_since: float = 0.0  # when the round became due (its queue wait starts there)
    max_attempts: int = 1  # the round fails the run at its next claim past this (L-12)
    # this attempt's model calls not committed yet: billed if the attempt fails (L-12)
    billed: list[dict[str, Any]] = field(default_factory=list)
    root: AgentSpec | None = None  # the submitted spec, when ``spec`` is a handoff's target


class _Retry(Exception):  # noqa: N818 - control flow
    """The model call failed transiently: give the round back, due again in ``delay`` s."""

    def __init__(self, delay: float, cause: str, counts: bool = True) -> None:
        super().__init__(delay, cause, counts)
        self.delay, self.cause, self.counts = delay, cause, counts


class _Stopped(Exception):  # noqa: N818 - control flow
    """The model call was stopped: the run's deadline passed, or the run was cancelled. The
    provider bills what it streamed: ``usage`` is that partial call, estimated."""

    def __init__(self, cause: Aborted, usage: dict[str, Any]) -> None:
        super().__init__(str(cause))
        self.cause, self.usage = cause, usage


class _Budget(Exception):  # noqa: N818 - control flow
    """The call cannot be afforded: the run's own ``max_cost`` (no ``envelope``), or a full
    spend envelope it counts against."""

    def __init__(self, message: str, envelope: Envelope | None = None, never: bool = False) -> None:
        super().__init__(message)
        self.envelope, self.never = envelope, never


class _Fatal(Exception):
    """The round cannot go on: the run fails with this message and ``code``."""

    def __init__(self, message: str, code: str = "model_error") -> None:
        super().__init__(message)
        self.code = code


class _Outage(_Fatal):
    """Transient model errors outlasted the retries: the run waits out its provider's outage
    (``shared.engine.outage``) instead of failing; ``attempt``: the attempts so far."""

    def __init__(self, message: str, attempt: int) -> None:
        super().__init__(message)
        self.attempt = attempt


def run_round(rt: Runtime, run_id: str, version: int, attempt_no: int = 0) -> RoundResult:
    """Claim and drive one round; counted in ``treadle_rounds{outcome}``."""
    result = _run_round(rt, run_id, version, attempt_no)
    metrics.ROUNDS.labels(kind=result.kind or "unknown", outcome=result.status).inc()
    return result


class _Holding:
    """A publisher that keeps back the first round of ``run_id`` a commit makes due at once
    (no countdown), for the task to drive here; it passes everything else on."""

    def __init__(self, inner: Publisher, run_id: str) -> None:
        self.inner, self.run_id = inner, run_id
        self.held: Dispatch | None = None

    def __call__(self, items: list[Dispatch]) -> None:
        out = []
        for d in items:
            mine = d.kind == "round" and d.run_id == self.run_id and not d.countdown
            if mine and self.held is None:
                self.held = d
            else:
                out.append(d)
        if out:
            self.inner(out)

    def take(self) -> Dispatch | None:
        held, self.held = self.held, None
        return held


@contextmanager
def rounds_in_place(
    rt: Runtime,
    run_id: str,
    more: Callable[[int], bool],
    drive: Callable[[Runtime, Dispatch], object] | None = None,
) -> Iterator[Runtime]:
    """Opt-in (``TREADLE_WORKER_IN_PLACE_S``), around a round or tool task: yields the
    runtime the task works with, whose publisher keeps back the run's next round when a
    commit makes it due at once (a round of quick tools, a tool batch's join); the task then
    claims and drives that round in this thread instead of through the broker, as long as
    ``more(rounds driven here so far)``; ``drive`` drives one (``run_round`` by default; the
    worker's wraps it in the round's span and log line). A crash in between loses nothing:
    the run's state says its round is due, and the reaper re-sends it; a round driven here
    that fails, or one held when the block ends, goes to the broker."""
    holding = _Holding(rt.publish, run_id)
    here = replace(rt, publish=holding)
    try:
        yield here
        n = 0
        while more(n) and (nxt := holding.take()) is not None:
            try:
                if drive is not None:
                    drive(here, nxt)
                else:
                    run_round(here, nxt.run_id, nxt.version, nxt.attempt)
            except Exception:
                rt.publish([nxt])
                raise
            n += 1
    finally:
        left = holding.take()
        if left is not None:
            rt.publish([left])


def _run_round(rt: Runtime, run_id: str, version: int, attempt_no: int) -> RoundResult:
    with rt.heartbeat.working(run_id):
        claim = _claim(rt, run_id, version)
        if claim is None:
            metrics.STALE.labels(reason="round").inc()
            return RoundResult("stale")
        if isinstance(claim, _Unreadable):
            reason = f"the run's stored spec or state cannot be used: {_cause(claim.cause)}"
            _fail(rt, claim.run, claim.owner, reason, failure.ROUND_ERROR)
            return RoundResult("committed", "Fail")
        metrics.ROUND_SECONDS.labels(phase="queue_wait").observe(
            max(0.0, claim.run.updated_at - claim.due_since)
        )
        try:
            return _settle_round(rt, claim, attempt_no)
        except Exception as exc:
            return _crashed(rt, claim, exc)


def _settle_round(rt: Runtime, claim: _Claim, attempt_no: int) -> RoundResult:
    kind = claim.spec.kind
    if claim.run.attempts > claim.max_attempts:  # the round kept failing: no more tries
        _fail(rt, claim.run, claim.owner, _exhausted(claim), failure.ATTEMPTS_EXHAUSTED)
        return RoundResult("committed", "Fail", kind)
    try:
        return replace(_drive(rt, claim, attempt_no), kind=kind)
    except _Retry as r:
        metrics.RETRIES.labels(cause="model" if r.counts else "capacity").inc()
        _give_back(rt, claim, r, attempt_no)
        claim.billed.clear()
        return RoundResult("retry", r.cause, kind)
    except _Budget as exc:
        return replace(_unaffordable(rt, claim, exc), kind=kind)
    except _Outage as exc:
        if failover.next_profile(claim.spec, claim.state, rt.profiles) is not None:
            failover.fail_over(
                rt, claim.run, claim.owner, claim.spec, claim.state, str(exc), claim.billed
            )
            return RoundResult("committed", "Failover", kind)
        down = outage.ProviderDown(
            claim.spec,
            claim.profile,
            limit_key(claim.profile, claim.run.tenant),
            str(exc),
            exc.attempt,
        )
        outage.wait_out(rt, claim.run, claim.owner, down, claim.billed)
        return RoundResult("committed", "Wait", kind)
    except _Fatal as exc:
        _fail(rt, claim.run, claim.owner, str(exc), exc.code, billed=claim.billed)
        return RoundResult("committed", "Fail", kind)
    except _Stopped as s:
        return replace(_stopped(rt, claim, s), kind=kind)


# --- claim -------------------------------------------------------------------------------------


def _claim(rt: Runtime, run_id: str, version: int) -> _Claim | _Unreadable | None:
    owner = rt.heartbeat.owner()

    def op(tx: Tx) -> _Claim | _Unreadable | None:
        claimed = rt.store.claim_round(
            tx.conn,
            run_id,
            version,
            owner,
            tx.ts,
            rt.heartbeat.live_after(tx.ts),
            cold=rt.caches.cold(run_id),
        )
        if claimed is None:
            return None
        run, abandoned, due_since, prefetched = (
            claimed.run,
            claimed.abandoned,
            claimed.due_since,
            claimed.prefetched,
        )
        if abandoned:
            metrics.TAKEOVERS.labels(what="round").inc()
        tx.recorded(run, ROUND_STARTED, round_started(run))  # the claim wrote it
        try:
            if prefetched is not None:
                rt.caches.prime(run, prefetched)
            return _read(rt, tx, run, owner, due_since, abandoned=abandoned)
        except Exception as exc:  # the claim stands (its attempt counted): the run fails
            if failure.infrastructure(exc):
                raise
            return _Unreadable(run, owner, exc)

    with transaction(rt) as tx:
        return op(tx)


@dataclass(frozen=True)
class _Unreadable:
    """A claimed round whose stored spec or state this code cannot read (a release that no
    longer accepts it, say): retrying cannot help, the run fails with the cause (L-12)."""

    run: Run
    owner: str
    cause: Exception


def _read(
    rt: Runtime, tx: Tx, run: Run, owner: str, due_since: float, *, abandoned: bool
) -> _Claim:
    """What the claimed round works from: its spec, profile, loop state and model view."""
    given = rt.caches.given(tx.conn, run.id, run.spec_rev)  # the row just read has it
    state = replace(
        LoopState.from_dict(run.loop),
        cost=run.cost,
        input_tokens=run.input_tokens,
        output_tokens=run.output_tokens,
    )
    spec = given.serving(run.loop)  # after a handoff, the serving agent's (docs/handoffs.md)
    profile, state = failover.serving(spec, state, rt.profiles, tx.ts)
    based = run.base_run_id is not None
    history = rt.caches.history(tx.conn, run.id, run.view_start, run.msg_seq, based=based)
    if abandoned:  # a worker died during this round's model call: the provider billed it
        _bill_abandoned(tx, run, profile, state)
        spend.settle_left(tx.conn, run)
    limit = spec.max_attempts or rt.settings.max_attempts
    inputs = given.inputs or {}
    root = given.spec if spec is not given.spec else None
    return _Claim(run, spec, inputs, profile, state, history, owner, due_since, limit, root=root)


def _crashed(rt: Runtime, claim: _Claim, exc: Exception) -> RoundResult:
    """The round raised (L-12, ``shared.engine.failure``): the database or the broker out of
    reach → the attempt is given back and the task's retry takes it up; a fatal error → the
    run fails at once; anything else → the round is tried again after a backoff, until its
    attempts run out. The model calls this attempt made are billed either way."""
    kind = claim.spec.kind
    if failure.infrastructure(exc):
        _release(rt, claim)
        raise exc
    run = claim.run
    log.warning("round %s v%s attempt %d failed", run.id, run.version, run.attempts, exc_info=exc)
    if failure.fatal(exc) or run.attempts >= claim.max_attempts:
        code = failure.ROUND_ERROR if failure.fatal(exc) else failure.ATTEMPTS_EXHAUSTED
        reason = _cause(exc) if failure.fatal(exc) else _exhausted(claim, exc)
        _fail(rt, run, claim.owner, reason, code, billed=claim.billed)
        return RoundResult("committed", "Fail", kind)
    delay = failure.backoff(run.attempts)
    change = Change(run, owner=claim.owner, bump=False, usage=list(claim.billed))
    change.values.update(
        lease_owner=None,
        wake_at=run_store.now() + delay,
        dispatched_at=run_store.now(),
        last_error=failure.describe(exc, run.attempts, run_store.now()),
        cost=Inc(_billed_cost(claim.billed)),
    )

    def op(tx: Tx) -> None:
        tx.apply(change)
        tx.out.append(Dispatch.round(run.id, run.version, countdown=delay, priority=run.priority))

    attempt(rt, op)  # lost: the run moved on meanwhile (a cancel): nothing to retry
    return RoundResult("retry", _cause(exc), kind)


def _cause(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _exhausted(claim: _Claim, exc: BaseException | None = None) -> str:
    """Why the run ends at its attempt bound: the last cause known."""
    n = claim.run.attempts
    if exc is not None:
        return f"the round failed {n} times; the last time: {_cause(exc)}"
    last = claim.run.last_error
    if last:
        return f"the round failed {n - 1} times; the last time: {last['type']}: {last['message']}"
    return f"the round was attempted {n - 1} times and never finished (its worker was lost)"


def _bill_lost(rt: Runtime, claim: _Claim) -> None:
    """The round lost its commit to a change of its run (a steer superseded it, a cancel
    ended it): the calls it made are still billed — in ``/usage``, not committed, and in the
    run's cost."""
    if not claim.billed:
        return
    attempt(rt, lambda tx: _bill_in(tx, claim.run.id, claim.billed))
    claim.billed.clear()


def _bill_in(tx: Tx, run_id: str, billed: list[dict[str, Any]]) -> None:
    """The calls ``billed`` in ``/usage`` (not committed) and in the run's cost, outside any
    transition of the run (it moved on, or its round was given back)."""
    if not billed:
        return
    run = run_store.load_run(tx.conn, run_id)
    if run is None:
        return
    cost = _billed_cost(billed)
    children.charge_ancestors(tx, run, cost)  # a child's parent pays too
    run = run_store.load_run(tx.conn, run.id) or run
    change = Change(run, bump=False, usage=list(billed))
    change.values["cost"] = Inc(cost)
    tx.apply(change)


def _billed_cost(billed: list[dict[str, Any]]) -> float:
    return float(sum(u.get("cost") or 0.0 for u in billed))


def _release(rt: Runtime, claim: _Claim) -> None:
    """The database or the broker failed the round (its commit, say, on a database restart):
    give it back, its attempt uncounted, so the task's retry or the reaper takes it up; the
    model calls the attempt made are billed in the same transaction (``committed: false``),
    since the round will call the model again. Best effort: if this fails too, the
    heartbeat's sweep of leases nobody works on frees it (``shared.engine.leases``)."""
    try:
        with transaction(rt) as tx:
            if run_store.release_round(
                tx.conn, claim.run.id, claim.run.version, claim.owner, None, counted=False
            ):
                _bill_in(tx, claim.run.id, claim.billed)
        claim.billed.clear()
    except Exception as exc:
        log.warning("round %s not given back (%s); the lease sweep will", claim.run.id, exc)
        rt.heartbeat.owe(claim.run.id, claim.billed)  # with its calls' usage rows
        claim.billed.clear()


def _bill_abandoned(tx: Tx, run: Run, profile: ModelProfile, state: LoopState) -> None:
    usage = {
        "round": state.round + 1,
        "purpose": "round",
        "profile": profile.name,
        "model": profile.model or profile.name,
        "estimated": True,
        "committed": False,
        "input_tokens": run.view_tokens,
    }
    records.insert_usage(tx.conn, run.id, [usage], tx.ts)


def _give_back(rt: Runtime, claim: _Claim, r: _Retry, attempt_no: int) -> None:
    """A transient failure: the round is due again in ``delay`` s; the same worker or another
    takes it then. A provider does not bill a 429 or a 5xx, but it bills a broken stream
    (and a context checkpoint made before): those calls are in ``claim.billed``."""
    wake = run_store.now() + r.delay
    with transaction(rt) as tx:
        if run_store.release_round(
            tx.conn, claim.run.id, claim.run.version, claim.owner, wake, counted=False, sent=tx.ts
        ):
            _bill_in(tx, claim.run.id, claim.billed)
            nxt = attempt_no + 1 if r.counts else attempt_no
            tx.out.append(
                Dispatch.round(
                    claim.run.id,
                    claim.run.version,
                    countdown=r.delay,
                    attempt=nxt,
                    priority=claim.run.priority,
                )
            )
    log.info("round %s v%s retry in %.1fs: %s", claim.run.id, claim.run.version, r.delay, r.cause)


# --- drive -------------------------------------------------------------------------------------


def _drive(rt: Runtime, claim: _Claim, attempt_no: int) -> RoundResult:
    run = claim.run  # as claimed (the input guardrails' checkpoint moves ``claim.run`` on)
    state = _ready(rt, claim)
    if isinstance(state, RoundResult):  # out of budget, routed, or an input guardrail tripped
        return state
    refs = attachment_refs(claim.inputs)
    catalog = toolkit.catalog(
        rt, run.id, claim.spec, refs, tenant=run.tenant, deadline=run.deadline_at
    )
    if catalog.deferred:  # an MCP listing in flight: come back for it, holding no thread
        raise _Retry(DEFER_S, "mcp listing", counts=False)
    checkpoint = _maybe_checkpoint(rt, claim, catalog, attempt_no)
    made = checkpoint.message if checkpoint is not None else None
    history = claim.history + ([made] if made is not None else [])
    if checkpoint is not None:  # a failure is remembered; a checkpoint made clears it
        state = replace(state, compress_failed_at=checkpoint.failed_at)
    view = _View(run, history, catalog, checkpoint)
    called = _call_guarded(rt, claim, _request(rt, claim, view, state), attempt_no)
    if isinstance(called, RoundResult):  # a parallel input guardrail tripped
        return called
    reply, latency, guards = called
    state = with_passed(state, claim.spec, guards.passed)
    return _step_and_commit(rt, claim, view, state, (reply, latency, guards))


def _ready(rt: Runtime, claim: _Claim) -> LoopState | RoundResult:
    """What comes before the request: the budgets (over one: the run ends, or this is its
    final call), the router (round 0) and the input guardrails that run first. Returns the
    round's loop state, or the round's result when one of them ended it."""
    verdict = check_budgets(claim.spec, claim.state, run_store.now(), claim.run.deadline_at)
    state = claim.state
    if verdict.stop_reason and not verdict.final_call:
        return _end(rt, claim, Finish(stop_reason=verdict.stop_reason, text=state.last_text))
    if verdict.final_call:
        state = replace(state, finalizing=verdict.stop_reason)
    if state.round == 0 and claim.spec.router:
        routed = _try_route(rt, claim)
        if routed is not None:
            return routed
    guarded = _input_guardrails(rt, claim)
    if guarded is not None:
        return guarded
    return replace(claim.state, finalizing=state.finalizing)


@dataclass(frozen=True)
class _View:
    """What the round's request is built from: the run as claimed, its messages (with the
    context checkpoint made this round, if any) and the tool catalog."""

    run: Run
    history: list[Message]
    catalog: Catalog
    checkpoint: _Checkpoint | None

    @property
    def made(self) -> bool:
        """A context checkpoint was made this round (the history ends with it)."""
        return self.checkpoint is not None and self.checkpoint.message is not None


def _request(rt: Runtime, claim: _Claim, view: _View, state: LoopState) -> RequestPlan:
    """The round's request: the model view (a handoff's view of the history), the dataset
    quotes, the tools of the catalog."""
    run, history = view.run, view.history
    seen = history if claim.root is None else view_for(claim.root, state.handoffs, history)
    inputs = request_inputs(rt, run.tenant, claim.inputs, claim.profile)
    req_spec, inputs = with_dataset_quotes(rt, run.id, run.tenant, claim.spec, seen, inputs)
    req = plan_request(
        req_spec,
        profile=claim.profile,
        state=state,
        messages=seen,
        catalog=view.catalog.entries,
        plan=run.plan,
        inputs=inputs,
        known_tokens=None if view.made or seen is not history else run.view_tokens,
    )
    return with_unavailable_note(req, view.catalog)  # MCP servers not listed: the model is told


def _step_and_commit(
    rt: Runtime,
    claim: _Claim,
    view: _View,
    state: LoopState,
    called: tuple[Reply, int, Checked],
) -> RoundResult:
    """The pure step on the reply, the output guardrails, then the one commit. A provider
    may reuse a tool call id of the run the model view no longer shows: the reply is
    sanitized against the ids taken and stepped once more."""
    run, catalog = view.run, view.catalog
    reply, latency, guards = called
    cached = rt.caches.call_ids(run.id, run.view_start, run.msg_seq)
    used = set(cached) if cached is not None else _call_ids(view.history)
    question = last_user_text(view.history)
    for _ in range(2):
        clean = sanitize_reply(reply, used)
        result = step(
            claim.spec,
            state,
            clean,
            catalog.entries,
            run.plan,
            call_cost=_price(claim.profile, clean),
            question=question,
        )
        result, checked = _output_guardrails(rt, claim, result, clean)
        try:
            return _commit(
                rt, claim, clean, result, catalog, latency, view.checkpoint, guards.merged(checked)
            )
        except _IdTaken:
            used |= _taken(rt, run.id, [c.id for c in clean.tool_calls])
    raise _Fatal("the reply's tool call ids collide with the run's", "engine_error")


def _call_ids(history: list[Message]) -> set[str]:
    """The tool call ids the model view already holds (a provider may reuse them)."""
    return {c.id for m in history for c in m.tool_calls}


class _IdTaken(Exception):  # noqa: N818 - control flow
    """A call id of the reply is the id of an earlier call of the run (before the view)."""


def _taken(rt: Runtime, run_id: str, ids: list[str]) -> set[str]:
    with reading(rt.engine) as conn:
        return call_store.call_ids_among(conn, run_id, ids)


@dataclass(frozen=True)
class _Checkpoint:
    """A compression tried this round: its checkpoint message (None: it failed, L-8) and its
    call's usage (None: no reply came, so nothing was billed); ``failed_at``: the run's
    message tokens when it failed (0: it did not)."""

    message: Message | None
    usage: dict[str, Any] | None
    failed_at: int = 0


def _maybe_checkpoint(
    rt: Runtime, claim: _Claim, catalog: Catalog, attempt_no: int
) -> _Checkpoint | None:
    """L-8: over 80% of the window → one model call summarizes the run so far into a
    ``<context_checkpoint>``; later rounds send only system + checkpoint + what follows.
    A failed compression keeps the original messages, is billed if it had a reply, and is
    not tried again until the messages have grown (``compression_due``)."""
    spec, profile = claim.spec, claim.profile
    if spec.kind != "agent":
        return None
    schema_tokens = rt.caches.schema_tokens(claim.run.id, catalog)
    tokens = claim.run.view_tokens + schema_tokens
    limit = min(int(profile.context_window * 0.8), profile.context_window - profile.max_tokens)
    if tokens <= limit:  # the stored count: no estimate needed
        return None
    if not compression_due(tokens, claim.state.compress_failed_at, profile.context_window):
        return None
    if not needs_checkpoint(
        claim.history, profile.context_window, profile.max_tokens, extra_tokens=schema_tokens
    ):
        return None
    plan = Plan.from_dict(claim.run.plan) if claim.run.plan else None
    active = plan if plan is not None and not plan.finished else None
    budget = max(1024, request_budget(profile.context_window, profile.max_tokens) // 2)
    msgs = checkpoint_request_messages(claim.history, active, budget_tokens=budget)
    req = RequestPlan(messages=tuple(msgs), max_tokens=profile.max_tokens)
    try:
        reply, latency = _call_model(rt, claim, req, attempt_no, live=False)
    except _Fatal as exc:
        log.warning("context checkpoint of %s failed (%s); keeping the messages", claim.run.id, exc)
        return _Checkpoint(None, None, failed_at=tokens)
    usage_row = {
        "round": claim.state.round + 1,
        "purpose": "compress",
        "profile": profile.name,
        **call_usage(reply, claim.profile, _price(profile, reply), latency),
    }
    summary = clean_checkpoint_summary(reply.text)
    if summary is None:
        log.warning("context checkpoint of %s came back empty; keeping the messages", claim.run.id)
        return _Checkpoint(None, usage_row, failed_at=tokens)
    return _Checkpoint(checkpoint_message(summary, active), usage_row)


def _try_route(rt: Runtime, claim: _Claim) -> RoundResult | None:
    question = next((m.text for m in reversed(claim.history) if m.role == "user"), "")
    rule = route(question, claim.spec.router)
    if rule is None or rule.pass_to_model or not rule.handler:
        return None
    text = run_handler(rule.handler, question)
    msg = Message(role="assistant", content=text)
    return _end(rt, claim, Finish(stop_reason="routed", text=text), [msg])


# --- guardrails (docs/guardrails.md) ------------------------------------------------------------


def _guarded(rt: Runtime, claim: _Claim, guards: list[Any], text: str, stage: Any) -> Checked:
    """``run_guardrails`` for the claimed round; what its model calls cost is billed even
    when one of them fails (``claim.billed``)."""
    out = Checked()
    try:
        run_guardrails(
            rt, claim.run, claim.spec, guards, text, stage, claim.state.round + 1, out=out
        )
    except spend.OverBudget as exc:
        raise _Budget(str(exc)) from exc
    except spend.EnvelopeFull as exc:
        raise _Budget(str(exc), exc.envelope, never=exc.never) from exc
    except BaseException:
        _billing(claim, out)
        raise
    return out


def _input_guardrails(rt: Runtime, claim: _Claim) -> RoundResult | None:
    """The input guardrails that run before the first model call: a tripwire ends the run;
    passing ones are checkpointed (their calls billed, their names in the loop state) so a
    re-run round does not run (or bill) them again."""
    guards = pending_input(claim.spec, claim.state, parallel=False)
    if not guards:
        return None
    checked = _guarded(rt, claim, guards, last_user_text(claim.history), "input")
    if checked.trip is not None:
        return _tripped(rt, claim, checked)
    state = with_passed(claim.state, claim.spec, checked.passed)
    state = state.add_usage(checked.input_tokens, checked.output_tokens, checked.cost)
    change = Change(claim.run, owner=claim.owner, bump=False, usage=list(checked.usage))
    change.values.update(
        loop=state.to_dict(),
        cost=Inc(checked.cost),
        input_tokens=Inc(checked.input_tokens),
        output_tokens=Inc(checked.output_tokens),
    )
    new = attempt(rt, lambda tx: tx.apply(change))
    if new is None:  # the run moved on (a cancel): the calls are billed still
        _billing(claim, checked)
        _bill_lost(rt, claim)
        return RoundResult("lost", kind=claim.spec.kind)
    claim.run, claim.state = new, state
    return None


def _tripped(
    rt: Runtime, claim: _Claim, checked: Checked, partial: dict[str, Any] | None = None
) -> RoundResult:
    """A guardrail tripped before the round's reply was used: the run ends (``stop_reason:
    guardrail``, a ``guardrail.tripped`` event); the guardrails' calls, the model call it
    made (``claim.billed``) or stopped (``partial``) are billed."""
    assert checked.trip is not None
    usage = checked.usage + claim.billed + ([partial] if partial else [])
    cost = sum(float(u.get("cost") or 0.0) for u in usage)
    change = Change.by_holder(claim.run, claim.owner)
    change.usage += usage
    change.values.update(
        cost=claim.run.cost + cost,
        input_tokens=claim.run.input_tokens + sum(u.get("input_tokens", 0) for u in usage),
        output_tokens=claim.run.output_tokens + sum(u.get("output_tokens", 0) for u in usage),
    )
    change.event(EventType.GUARDRAIL_TRIPPED, round=claim.state.round, **checked.trip.as_dict())
    settle(change, tripped_finish(checked.trip), ts=run_store.now())
    new = attempt(rt, lambda tx: tx.apply(change))
    if new is None:
        _bill_lost(rt, claim)
        return RoundResult("lost", kind=claim.spec.kind)
    claim.billed.clear()
    return RoundResult("committed", "Finish", claim.spec.kind)


def _call_guarded(
    rt: Runtime, claim: _Claim, req: RequestPlan, attempt_no: int
) -> tuple[Reply, int, Checked] | RoundResult:
    """The round's model call, with the input guardrails that run alongside it
    (``parallel: true``) in a thread: one that trips aborts the call in flight."""
    guards = pending_input(claim.spec, claim.state, parallel=True)
    if not guards:
        reply, latency = _call_model(rt, claim, req, attempt_no)
        return reply, latency, Checked()
    abort = Abort(claim.run.deadline_at)
    box: dict[str, Any] = {}
    worker = _beside(rt, claim, guards, abort, box)
    try:
        reply, latency = _call_model(rt, claim, req, attempt_no, abort=abort)
    except BaseException as exc:
        worker.join()
        found = box.get("checked")
        if isinstance(exc, _Stopped) and found is not None and found.trip is not None:
            return _tripped(rt, claim, found, exc.usage)
        if found is not None:  # the guardrails' calls are billed whatever became of the round
            _billing(claim, found)
        raise
    worker.join()
    if "error" in box:
        raise box["error"]
    found = box["checked"]
    if found.trip is not None:  # the call came back first: its reply is not used
        return _tripped(rt, claim, found)
    _billing(claim, found)
    return reply, latency, found


def _beside(
    rt: Runtime, claim: _Claim, guards: list[Any], abort: Abort, box: dict[str, Any]
) -> threading.Thread:
    """The parallel input guardrails, started in a thread (the caller's context copied):
    what they found goes in ``box["checked"]`` (or what they raised in ``box["error"]``);
    one that trips cancels ``abort``, the model call in flight."""
    text = last_user_text(claim.history)

    def check() -> None:
        try:
            box["checked"] = found = _guarded(rt, claim, guards, text, "input")
        except BaseException as exc:
            box["error"] = exc
            return
        if found.trip is not None:
            abort.cancel(f"guardrail {found.trip.name} tripped")

    worker = threading.Thread(target=contextvars.copy_context().run, args=(check,), daemon=True)
    worker.start()
    return worker


def _billing(claim: _Claim, checked: Checked) -> None:
    """Guardrail calls the round's commit will record: billed (``claim.billed``) if the
    commit is lost or the attempt fails instead."""
    claim.billed += [{**u, "committed": False} for u in checked.usage]


def _output_guardrails(
    rt: Runtime, claim: _Claim, result: StepResult, reply: Reply
) -> tuple[StepResult, Checked]:
    """The output guardrails on the final answer (and, for those with ``tool_calls``, on
    each call the reply makes): a tripwire replaces what the round decided with the end of
    the run (the answer withheld)."""
    spec, decision = claim.spec, result.decision
    if isinstance(decision, Finish) and decision.stop_reason != GUARDRAIL_STOP:
        guards, texts = spec.output_guardrails, [decision.text]
        stage = "output"
    elif isinstance(decision, RunTools):
        guards = [g for g in spec.output_guardrails if g.tool_calls]
        texts = [tool_call_text(c.name, c.arguments) for c in reply.tool_calls]
        stage = "tool_call"
    else:
        return result, Checked()
    out = Checked()
    for text in texts if guards else []:
        checked = _guarded(rt, claim, list(guards), text, stage)
        _billing(claim, checked)
        out = out.merged(checked)
        if checked.trip is not None:
            return replace(result, decision=tripped_finish(checked.trip)), out
    return result, out


# --- the model call ------------------------------------------------------------------------------


def _to_model_request(req: RequestPlan) -> ModelRequest:
    return ModelRequest(
        messages=req.messages,
        tools=tuple(ToolDef(t.name, t.description, t.parameters) for t in req.tools),
        tool_choice=req.tool_choice,
        max_tokens=req.max_tokens,
        response_format=req.response_format,
    )


def _call_model(
    rt: Runtime,
    claim: _Claim,
    req: RequestPlan,
    attempt_no: int,
    live: bool = True,
    abort: Abort | None = None,
) -> tuple[Reply, int]:
    run = claim.run
    model = make_model(claim.profile, run.tenant, rt.settings.allow_hosts, rt.tool_modes)
    offsets = {"text": 0, "reasoning": 0}  # characters of this call's reply so far, per kind
    on_delta = _delta_sink(rt, claim, offsets, live)
    with rt.gate.outside(Stage.REPLY):  # the permit and the call: waits, not engine work
        key, permit = _permit(rt, claim, req)
        started = run_store.now()
        # the stream is closed at the deadline, on a cancel, or when a parallel guardrail trips
        abort = abort or Abort(run.deadline_at)
        try:
            with _held(rt, claim, _to_model_request(req)) as held:
                with (
                    _costed(claim, held, offsets, started, live),
                    rt.stopper.holding(run.id, abort, rt.live),
                ):
                    reply = model.complete(held.request, on_delta, abort=abort)
                held.cost = _price(claim.profile, reply)
        except TransientModelError as exc:
            if exc.status == 429 and exc.retry_after:
                with _limiter_quietly("pause"):
                    rt.limiter.pause(key, exc.retry_after)  # the whole fleet holds off this profile
            raise _retry_or_fatal(rt, claim, exc, attempt_no) from exc
        except FatalModelError as exc:
            raise _Fatal(str(exc)) from exc
        finally:
            with _limiter_quietly("release"):
                rt.limiter.release(permit)
    _count_model(claim.profile, reply, run_store.now() - started)
    latency = int((run_store.now() - started) * 1000)
    claim.billed.append(  # the provider bills it whatever becomes of this attempt (L-12)
        {
            "round": claim.state.round + 1,
            "purpose": "round" if live else "compress",
            "profile": claim.profile.name,
            **call_usage(reply, claim.profile, _price(claim.profile, reply), latency),
            "committed": False,
        }
    )
    return reply, latency


def _delta_sink(
    rt: Runtime, claim: _Claim, offsets: dict[str, int], live: bool
) -> Callable[[Delta], None]:
    """The stream's callback: a live call publishes its text and reasoning deltas (C-4: each
    behind its flag); every call counts the characters of each kind in ``offsets``."""
    run_id, round_no = claim.run.id, claim.state.round + 1

    def on_delta(d: Delta) -> None:
        streamed = d.kind in ("text", "reasoning") and stream_enabled(claim.spec, d.kind)
        if live and streamed and d.text:
            # offset: where the piece starts in the reply (facades number deltas by it)
            rt.live.publish(
                run_id,
                {
                    "type": f"{d.kind}.delta",
                    "data": {"text": d.text, "round": round_no, "offset": offsets[d.kind]},
                },
            )
        if d.kind in offsets:
            offsets[d.kind] += len(d.text or "")

    return on_delta


def _permit(rt: Runtime, claim: _Claim, req: RequestPlan) -> tuple[str, Permit]:
    """A permit of the profile's fleet limits for the call (its limiter key with it); the
    fleet at capacity: the round gives its thread back and comes back later."""
    key, limits = limit_key(claim.profile, claim.run.tenant), limits_of(claim.profile)
    tokens = claim.run.view_tokens + (req.max_tokens or 0)
    permit = _acquire(rt, key, limits, tokens, claim.profile.timeout_total)
    if not permit.granted:
        raise _Retry(permit.wait, "capacity", counts=False)
    return key, permit


@contextmanager
def _costed(
    claim: _Claim, held: spend.Held, offsets: dict[str, int], started: float, live: bool
) -> Iterator[None]:
    """The reservation's cost when the call does not come back with a reply: a call stopped
    midway is priced on what it streamed (``_Stopped``); a broken stream is billed by the
    provider (its row in ``claim.billed``); a refused or failed call costs nothing."""
    try:
        yield
    except Aborted as exc:
        partial = _partial(claim, claim.run.view_tokens, offsets, started)
        held.cost = float(partial["cost"])
        raise _Stopped(exc, partial) from exc
    except BrokenStream as exc:  # it streamed, then broke: the provider bills it
        row = _broken_row(claim, exc, started, live)
        held.cost = float(row["cost"])
        claim.billed.append(row)
        raise
    except (TransientModelError, FatalModelError):
        held.cost = 0.0  # refused or failed: not billed
        raise


@contextmanager
def _held(rt: Runtime, claim: _Claim, request: ModelRequest) -> Iterator[spend.Held]:
    """The call's reservation (``shared.engine.spend``): a call its budget or an envelope
    cannot afford is not made (``_Budget``)."""
    try:
        with spend.held_for(rt, claim.run, claim.spec, claim.profile, request) as held:
            yield held
    except spend.OverBudget as exc:
        raise _Budget(str(exc)) from exc
    except spend.EnvelopeFull as exc:
        raise _Budget(str(exc), exc.envelope, never=exc.never) from exc


LIMITER_RETRY_S = 5.0  # the fleet limiter unreachable with TREADLE_LIMITER_ON_FAILURE=closed


def _acquire(rt: Runtime, key: str, limits: Limits, tokens: int, ttl: float) -> Permit:
    """A permit of the profile's fleet-wide limits. Redis unreachable: the model is called
    without them (``TREADLE_LIMITER_ON_FAILURE=open``, a warning logged), or the round is
    given back for a later try (``closed``)."""
    try:
        return rt.limiter.acquire(key, limits, tokens, ttl)
    except Exception as exc:
        if rt.settings.limiter_on_failure == "closed":
            raise _Retry(LIMITER_RETRY_S, f"limiter unavailable: {exc}", counts=False) from exc
        log.warning("fleet limiter unavailable (%s); calling the model without it", exc)
        return Permit(key, None)


@contextmanager
def _limiter_quietly(what: str) -> Iterator[None]:
    """A limiter call whose failure must not fail the round (a slot expires by itself)."""
    try:
        yield
    except Exception as exc:
        log.warning("fleet limiter %s failed: %s", what, exc)


def _partial(
    claim: _Claim, input_tokens: int, offsets: dict[str, int], started: float
) -> dict[str, Any]:
    """The usage row of a call stopped midway: what it was sent, what it streamed, priced."""
    out = (offsets["text"] + offsets["reasoning"] + 3) // 4
    usage = Usage(input_tokens=input_tokens, output_tokens=out, estimated=True)
    return {
        "round": claim.state.round + 1,
        "purpose": "round",
        "profile": claim.profile.name,
        "model": claim.profile.model or claim.profile.name,
        "input_tokens": input_tokens,
        "output_tokens": out,
        "estimated": True,
        "committed": True,
        "cost": price_call(claim.profile.pricing, usage, claim.profile.own_key),
        "latency_ms": int((run_store.now() - started) * 1000),
    }


def _broken_row(claim: _Claim, exc: BrokenStream, started: float, live: bool) -> dict[str, Any]:
    """The usage row of a broken stream's call (M-2): what it was sent and what streamed,
    estimated and priced; not committed (its reply is never the answer)."""
    fields = {k: v for k, v in (exc.usage or {}).items() if k in Usage.__slots__}
    usage = Usage(**fields) if fields else Usage(input_tokens=claim.run.view_tokens)
    usage = replace(usage, estimated=True)
    return {
        "round": claim.state.round + 1,
        "purpose": "round" if live else "compress",
        "profile": claim.profile.name,
        "model": claim.profile.model or claim.profile.name,
        **usage.to_dict(),
        "committed": False,
        "cost": price_call(claim.profile.pricing, usage, claim.profile.own_key),
        "latency_ms": int((run_store.now() - started) * 1000),
    }


def _unaffordable(rt: Runtime, claim: _Claim, b: _Budget) -> RoundResult:
    """The run's own budget ends it (``budget_cost``); a full envelope makes it wait for the
    period to turn or the cap to be raised, or fail, as the envelope says."""
    if b.envelope is None:
        return _end(rt, claim, Finish(stop_reason="budget_cost", text=claim.state.last_text))
    if b.envelope.on_exceed == "fail" or b.never:
        _fail(rt, claim.run, claim.owner, str(b), spend.ENVELOPE_FULL)
        return RoundResult("committed", "Fail")
    spend.wait_for(rt, claim.run, claim.owner, b.envelope)
    return RoundResult("committed", "Wait")


def _stopped(rt: Runtime, claim: _Claim, s: _Stopped) -> RoundResult:
    """A deadline ends the run (``budget_deadline``) with the partial call billed; a cancel
    already ended it: the partial call is added to its usage."""
    if isinstance(s.cause, DeadlineExceeded):
        finish = Finish(stop_reason="budget_deadline", text=claim.state.last_text)
        return _end(rt, claim, finish, usage=s.usage)

    def bill(tx: Tx) -> None:
        run = run_store.load_run(tx.conn, claim.run.id)
        if run is None:
            return
        children.charge_ancestors(tx, run, s.usage["cost"])  # a child's parent pays too
        run = run_store.load_run(tx.conn, run.id) or run
        change = Change(run, bump=False, usage=[s.usage])
        change.values.update(
            cost=run.cost + s.usage["cost"],
            input_tokens=run.input_tokens + s.usage["input_tokens"],
            output_tokens=run.output_tokens + s.usage["output_tokens"],
        )
        tx.apply(change)

    attempt(rt, bill)
    return RoundResult("lost", "cancelled")


def _count_model(profile: ModelProfile, reply: Reply, seconds: float) -> None:
    metrics.ROUND_SECONDS.labels(phase="model").observe(seconds)
    if reply.usage is not None:
        name = _metric_label(profile)
        metrics.MODEL_TOKENS.labels(profile=name, direction="input").inc(reply.usage.input_tokens)
        metrics.MODEL_TOKENS.labels(profile=name, direction="output").inc(reply.usage.output_tokens)
        metrics.MODEL_COST.labels(profile=name).inc(_price(profile, reply))


def _metric_label(profile: ModelProfile) -> str:
    """An operator's profile by name; a tenant's all as "inline" (no tenant's endpoint, nor
    how many there are, in the metrics)."""
    return profile.name if profile.operator else "inline"


def _retry_or_fatal(
    rt: Runtime, claim: _Claim, exc: TransientModelError, attempt_no: int
) -> Exception:
    limit = claim.profile.max_retries
    if limit is None:
        limit = rt.settings.model_max_retries
    delay = backoff_delay(attempt_no, retry_after=exc.retry_after)
    deadline = claim.run.deadline_at
    message = f"model call failed after {attempt_no + 1} attempts: {exc}"
    if deadline is not None and run_store.now() + delay >= deadline:
        return _Fatal(message)
    if attempt_no >= limit:
        return _Outage(message, attempt_no)
    return _Retry(delay, str(exc))


def _price(profile: ModelProfile, reply: Reply) -> float:
    """M-9: each call priced on its own (a continued reply holds several calls)."""
    calls = reply.extra.get("call_usages") if reply.extra else None
    if calls:
        return sum(
            price_call(
                profile.pricing,
                Usage(**{k: v for k, v in u.items() if k in Usage.__slots__}),
                profile.own_key,
            )
            for u in calls
        )
    if reply.usage is None:
        return 0.0
    return price_call(profile.pricing, reply.usage, profile.own_key)


# --- commit ------------------------------------------------------------------------------------


def _commit(
    rt: Runtime,
    claim: _Claim,
    reply: Reply,
    result: StepResult,
    catalog: Catalog,
    latency: int,
    checkpoint: _Checkpoint | None,
    guards: Checked,
) -> RoundResult:
    run = claim.run
    round_ = result.state.round
    change = Change.by_holder(run, claim.owner)
    _note(change, claim, result, catalog, guards)
    if checkpoint is not None:
        _checkpointed(change, checkpoint, round_, claim.profile.context_window)
    change.message(result.message, round_)
    for m in result.followups:  # an output repair prompt
        change.message(m, round_)
    _set_totals(change, run, result, checkpoint, guards)
    change.usage.append(
        {
            "round": round_,
            "purpose": "round",
            "profile": claim.profile.name,
            **call_usage(reply, claim.profile, result.state.cost - claim.state.cost, latency),
        }
    )
    if result.plan != run.plan:
        change.event(EventType.PLAN_UPDATED, plan=result.plan)
    decision = result.decision
    ran: list[tuple[Call, ToolResult]] = []
    if isinstance(decision, RunTools):
        decision, ran = _tools(rt, claim, change, decision, catalog, round_)
    elif isinstance(decision, Finish | Fail | Continue):  # Continue: an output repair round
        settle(change, decision, ts=run_store.now())
    return _apply(rt, claim, change, type(decision).__name__, ran)


def _checkpointed(change: Change, checkpoint: _Checkpoint, round_: int, window: int) -> None:
    """The compression tried this round: its checkpoint message, its call billed, or the
    warning that it failed and at how many tokens it is tried again (L-8)."""
    if checkpoint.message is not None:
        change.message(checkpoint.message, round_)
    if checkpoint.usage is not None:
        change.usage.append(checkpoint.usage)
    if checkpoint.failed_at:
        change.event(
            EventType.CONTEXT_UNCOMPRESSED,
            round=round_,
            level="warning",
            tokens=checkpoint.failed_at,
            retry_at=compression_retry_at(checkpoint.failed_at, window),
            billed=checkpoint.usage is not None,
        )


def _note(
    change: Change, claim: _Claim, result: StepResult, catalog: Catalog, guards: Checked
) -> None:
    """The round's events before its messages: a guardrail that tripped (its calls billed
    with the round), MCP servers not listed, a handoff (docs/handoffs.md)."""
    round_ = result.state.round
    if guards.trip is not None:
        change.event(EventType.GUARDRAIL_TRIPPED, round=round_, **guards.trip.as_dict())
    change.usage += guards.usage
    if (missing := catalog.unavailable_event()) is not None:
        change.event(EventType.TOOL_UNAVAILABLE, round=round_, **missing)
    if (moved := result.state.handoffs) != claim.state.handoffs:
        before = claim.state.handoffs
        change.event(
            EventType.RUN_HANDOFF,
            round=round_,
            to=moved[-1],
            path=list(moved),
            **{"from": before[-1] if before else None},
        )


def _set_totals(
    change: Change,
    run: Run,
    result: StepResult,
    checkpoint: _Checkpoint | None,
    guards: Checked,
) -> None:
    """The run's loop state, cost, tokens and plan after the round; after a checkpoint, the
    model view starts at it (the change's messages already added)."""
    round_ = result.state.round
    billed = checkpoint.usage if checkpoint is not None else None
    cost = result.state.cost + (billed["cost"] if billed else 0.0)
    loop = result.state.add_usage(guards.input_tokens, guards.output_tokens, guards.cost)
    change.values.update(
        loop=loop.to_dict(),
        cost=cost + guards.cost,
        input_tokens=loop.input_tokens,
        output_tokens=loop.output_tokens,
        plan=result.plan,
        round=round_,
    )
    if checkpoint is not None and checkpoint.message is not None:  # the view starts at it
        change.values["view_start"] = run.msg_seq + 1
        change.values["view_tokens"] = sum(records.message_tokens(change.messages))


def _tools(
    rt: Runtime,
    claim: _Claim,
    change: Change,
    decision: RunTools,
    catalog: Catalog,
    round_: int,
) -> tuple[RunTools, list[tuple[Call, ToolResult]]]:
    """A tool round: a batch of quick calls runs before the commit (all results foldable:
    they go into it); the calls left fan out as rows and tool tasks. Returns the batch the commit
    records and the quick calls whose results a join must read."""
    results = _run_quick(rt, claim, decision, catalog)
    folded = results if results and all(_foldable(r) for r in results.values()) else None
    if folded is not None:
        decision = _with_results(rt, claim, change, decision, folded, round_)  # none left
    _fan_out(claim, change, decision, catalog, round_, folded)
    if results is not None and change.queue_tools:  # a result the join must read
        return decision, _ran(change, results)
    return decision, []


def _run_quick(
    rt: Runtime, claim: _Claim, decision: RunTools, catalog: Catalog
) -> dict[str, ToolResult] | None:
    """A batch whose calls are all quick (read-only, in-process, no I/O) runs here, before
    the round's commit, and its results go into that commit: a tool round is one task and
    one commit instead of a round task, a tool task and their commits. So does a batch of
    one read-only call when the operator opted in (``runs_in_round``). Any other batch:
    None (each call's task runs it)."""
    pending = [c for c in decision.calls if c.status == CallStatus.PENDING.value]
    if not pending or len(pending) > claim.spec.effective_parallel_tools:
        return None
    tools = [catalog.tool(c.name) for c in pending]
    if not runs_in_round(rt, tools):
        return None
    if any(children.sub_agent_of(claim.spec, c.name) is not None for c in pending):
        return None
    results = {}
    for c, tool in zip(pending, tools, strict=True):
        call = Call.of(
            {
                "run_id": claim.run.id,
                "call_id": c.call_id,
                "round": 0,
                "idx": c.index,
                "name": c.name,
                "arguments": c.arguments,
                "read_only": True,
                "status": CallStatus.QUEUED.value,
            }
        )
        with metrics.TOOL_SECONDS.labels(tool=c.name).time():
            results[c.call_id] = execute_tool(rt, claim.run, claim.inputs, tool, call)
    return results


def _foldable(result: ToolResult) -> bool:
    """A result with no cost or stop for the join to account for: its text (and its data,
    such as an HTTP tool's status) go into the round's own commit."""
    return not result.cost and not result.stop


def _with_results(
    rt: Runtime,
    claim: _Claim,
    change: Change,
    decision: RunTools,
    results: dict[str, ToolResult],
    round_: int,
) -> RunTools:
    """The batch with the quick calls' results known (``done``): the round's own change
    writes their rows, tool messages and events, and settles what the round decided."""
    calls = []
    for c in decision.calls:
        got = results.get(c.call_id)
        if got is None:
            calls.append(c)
            continue
        calls.append(replace(c, status=CallStatus.DONE.value, result=got.text))
        call = Call.of(
            {
                "run_id": claim.run.id,
                "call_id": c.call_id,
                "round": round_,
                "idx": c.index,
                "name": c.name,
                "arguments": c.arguments,
                "read_only": True,
                "status": "done",
            }
        )
        done = finished(rt, claim.spec, claim.run.id, call, got, started=True)
        change.events += finish_events(c.call_id, c.name, done)
    return RunTools(calls=tuple(calls), then=decision.then)


def _ran(change: Change, results: dict[str, ToolResult]) -> list[tuple[Call, ToolResult]]:
    """The queued calls of the fan-out with the results this task got for them: they commit
    through ``finish_call`` in the round's transaction (a result with a cost, data or a
    stop), and no tool task is sent."""
    queued = set(change.queue_tools)
    ran = [(Call.of(r), results[r["call_id"]]) for r in change.calls if r["call_id"] in queued]
    change.queue_tools.clear()
    return ran


def _apply(
    rt: Runtime,
    claim: _Claim,
    change: Change,
    detail: str,
    ran: list[tuple[Call, ToolResult]] | None = None,
) -> RoundResult:
    """The round's change in one transaction; with ``ran``, the results of the calls this
    task ran (``_run_quick``) and their join in the same one."""

    def op(tx: Tx) -> Run:
        if ran:  # the join may end or pause the run: its thread and lineage are locked first
            tx.prepare(claim.run, ending=True, tells_parent=True)
        # each try applies a fresh copy (a try rolled back on a held row may have added the
        # run's posted messages to the one it applied)
        new = tx.apply(change.copy())
        for call, result in ran or ():
            done = finished(rt, claim.spec, claim.run.id, call, result, started=True)
            new = finish_call(
                tx,
                new,
                call,
                done,
                from_status=[CallStatus.QUEUED],
                ask_timeout_s=claim.spec.ask_timeout_s,
            )
            if result.stop:  # the later calls are skipped (L-6): their results are dropped
                break
        return new

    try:
        new = when_free(lambda: attempt(rt, op), f"round of {claim.run.id}")
    except (IntegrityError, DataError) as exc:  # a reply the database refuses: never retry it
        if isinstance(exc, IntegrityError) and "tool_calls" in str(exc.orig) and change.calls:
            raise _IdTaken from exc
        log.warning("round of %s refused by the database: %s", claim.run.id, exc)
        reason = f"the reply could not be stored: {exc.orig}"
        _fail(rt, claim.run, claim.owner, reason, "engine_error")
        return RoundResult("committed", "Fail")
    if new is None:  # superseded (a steer, a cancel): its model calls were billed still
        _bill_lost(rt, claim)
        return RoundResult("lost")
    claim.billed.clear()  # the commit wrote their usage rows
    return RoundResult("committed", detail)


def _fan_out(
    claim: _Claim,
    change: Change,
    decision: RunTools,
    catalog: Catalog,
    round_: int,
    ran: dict[str, ToolResult] | None = None,
) -> None:
    """The reply's calls become rows; the first window of external calls is dispatched, or
    everything settles at once when there is nothing to run. ``ran``: the results of the
    calls this task ran, by call id (their data goes in their rows)."""
    ts = run_store.now()
    budget = tool_result_budget(claim.profile.context_window, claim.spec.tool_result_max_tokens)
    got = ran or {}
    rows = [
        _call_row(claim.run.id, c, round_, budget, ts, got.get(c.call_id)) for c in decision.calls
    ]
    pending = [r for r in rows if r["status"] == CallStatus.PENDING.value]
    if pending:
        for r in pending[: claim.spec.effective_parallel_tools]:
            r.update(status=CallStatus.QUEUED.value, queued_at=ts)
            change.queue_tools.append(r["call_id"])
        change.calls = rows
        change.values.update(
            status=Status.RUNNING,
            open_calls=len(pending),
            after_join={**encode_after(decision.then), "calls": len(rows)},
            lease_owner=None,
        )
        return
    msgs, flushed = flush([Call.of(r) for r in rows])
    for r in rows:
        r["flushed"] = r["call_id"] in flushed
    change.calls = rows
    for m in msgs:
        change.message(m, round_)
    settle(change, decision.then, ts=ts, ask_timeout_s=claim.spec.ask_timeout_s)


def _call_row(
    run_id: str, c: Any, round_: int, budget: int, ts: float, ran: ToolResult | None
) -> dict[str, Any]:
    done = c.status == CallStatus.DONE
    return {
        "run_id": run_id,
        "call_id": c.call_id,
        "round": round_,
        "idx": c.index,
        "name": c.name,
        "arguments": c.arguments,
        "read_only": c.read_only,
        "status": c.status,
        "attempts": 0,
        "result": c.result,
        "result_for_model": reduce_tool_result(c.result, budget) if c.result is not None else None,
        "cost": 0.0,
        "flushed": False,
        "queued_at": None,
        "finished_at": ts if done else None,
        "data": (ran.data or None) if ran is not None else None,
    }


def _end(
    rt: Runtime,
    claim: _Claim,
    finish: Finish,
    extra: list[Message] | None = None,
    usage: dict[str, Any] | None = None,
) -> RoundResult:
    """End the run without a (whole) model call: a budget exhausted, routed, a deadline that
    stopped the call (``usage``: that partial call)."""
    change = Change.by_holder(claim.run, claim.owner)
    for m in extra or []:
        change.message(m, claim.state.round)
    if usage is not None:
        change.usage.append(usage)
        change.values.update(
            cost=claim.run.cost + usage["cost"],
            input_tokens=claim.run.input_tokens + usage["input_tokens"],
            output_tokens=claim.run.output_tokens + usage["output_tokens"],
        )
    settle(change, finish, ts=run_store.now())
    new = attempt(rt, lambda tx: tx.apply(change))
    return RoundResult("committed" if new is not None else "lost", "Finish", claim.spec.kind)


def _fail(
    rt: Runtime,
    run: Run,
    owner: str,
    message: str,
    code: str,
    billed: list[dict[str, Any]] | None = None,
) -> None:
    """The run fails with ``message``: a fatal model error, a reply the database refused, a
    round that failed for good (``billed``: the model calls its attempt made)."""
    change = Change.by_holder(run, owner, failing=True)
    if billed:
        change.usage += billed
        change.values["cost"] = Inc(_billed_cost(billed))
    settle(change, Fail(reason=message, code=code), ts=run_store.now())
    attempt(rt, lambda tx: tx.apply(change))
