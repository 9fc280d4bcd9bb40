"""One round (DESIGN §3): claim → budget → request → model → step → one commit → publish."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import RowMapping

from shared.agent.attachments import attachment_refs
from shared.agent.budget import check_budgets
from shared.agent.chat import stream_enabled
from shared.agent.compression import (
    checkpoint_message,
    checkpoint_request_messages,
    clean_checkpoint_summary,
    needs_checkpoint,
    reduce_tool_result,
    tool_result_budget,
)
from shared.agent.decisions import Fail, Finish, RunTools
from shared.agent.history import request_budget
from shared.agent.messages import Message, Reply, Usage
from shared.agent.plan import Plan
from shared.agent.pricing import price_call
from shared.agent.request import RequestPlan, plan_request, split_question
from shared.agent.router import route
from shared.agent.spec import AgentSpec, ModelProfile
from shared.agent.state import LoopState
from shared.agent.step import StepResult, step
from shared.agent.tokens import estimate_tokens
from shared.engine import cache, metrics, threads
from shared.engine.afters import encode_after, flush_calls, settle
from shared.engine.attachments import request_inputs
from shared.engine.catalog import Catalog, build_catalog
from shared.engine.handlers import run_handler
from shared.engine.knowledge import with_dataset_quotes
from shared.engine.leases import renewer_for
from shared.engine.runtime import Runtime, worker_id
from shared.errors import FatalModelError, TransientModelError
from shared.llm.base import Delta, ModelRequest, ToolDef
from shared.llm.profiles import make_model, resolve_profile
from shared.llm.ratelimit import limits_of
from shared.store import repo
from shared.store.tables import outbox, tool_calls, usage

__all__ = ["RetryRound", "RoundResult", "run_round"]

log = logging.getLogger("treadle.round")


class RetryRound(Exception):  # noqa: N818 - control flow, not an error
    """The model call failed transiently: retry the round after ``delay`` seconds."""

    def __init__(self, delay: float, cause: str, counts: bool = True) -> None:
        super().__init__(delay, cause, counts)
        self.delay = delay
        self.cause = cause
        self.counts = counts  # False: waiting for fleet capacity is not a failed attempt


@dataclass(frozen=True)
class RoundResult:
    status: str  # stale | committed | lost
    detail: str = ""
    kind: str | None = None


@dataclass
class _Claim:
    run: RowMapping
    spec: AgentSpec
    profile: ModelProfile
    state: LoopState
    history: list[Message]
    usage_id: int | None
    owner: str


def run_round(
    rt: Runtime, run_id: str, version: int, outbox_id: int | None, attempt: int = 0
) -> RoundResult:
    """Claim and drive one round; counted in ``treadle_rounds{outcome}``."""
    try:
        result = _run_round(rt, run_id, version, outbox_id, attempt)
    except RetryRound as r:
        metrics.RETRIES.labels(cause="capacity" if not r.counts else "model").inc()
        metrics.ROUNDS.labels(kind="agent", outcome="retry").inc()
        raise
    metrics.ROUNDS.labels(kind=result.kind or "unknown", outcome=result.status).inc()
    return result


def _run_round(
    rt: Runtime, run_id: str, version: int, outbox_id: int | None, attempt: int = 0
) -> RoundResult:
    claim = _claim(rt, run_id, version, outbox_id)
    if claim is None:
        return RoundResult("stale")
    metrics.ROUND_SECONDS.labels(phase="queue_wait").observe(
        max(0.0, repo.now() - claim.run["updated_at"])
    )
    try:
        return replace(_drive(rt, claim, version, outbox_id, attempt), kind=claim.spec.kind)
    except RetryRound:
        _release(rt, run_id, version, claim.owner, claim.usage_id)
        raise
    except _FatalRound as exc:
        fail_round(rt, run_id, version, outbox_id, str(exc))
        return RoundResult("committed", "Fail", claim.spec.kind)


def _claim(rt: Runtime, run_id: str, version: int, outbox_id: int | None) -> _Claim | None:
    ts = repo.now()
    owner = worker_id()
    with rt.engine.begin() as conn:
        run = repo.claim_round(conn, run_id, version, owner, rt.settings.lease_seconds, ts)
        if run is None:
            _drop_if_stale(conn, run_id, version, outbox_id)
            return None
        spec = cache.spec_of(run)
        profile = resolve_profile(spec.model, rt.profiles)
        state = replace(
            LoopState.from_dict(run["loop"]),
            cost=run["cost"],
            input_tokens=run["input_tokens"],
            output_tokens=run["output_tokens"],
        )
        history = cache.history(conn, run_id, run["view_start"], run["msg_seq"])
        usage_id = conn.execute(
            sa.insert(usage)
            .values(
                run_id=run_id,
                round=state.round + 1,
                purpose="round",
                profile=profile.name,
                model=profile.model or profile.name,
                estimated=True,
                committed=False,
                input_tokens=sum(estimate_tokens(m.text) for m in history),
                created_at=ts,
            )
            .returning(usage.c.id)
        ).scalar_one()
        hooks = repo.insert_event(
            conn, run, "round.started", {"round": state.round + 1}, ts, rt.settings.redrive_seconds
        )
    rt.publish(hooks)
    rt.wake(run_id, run["event_seq"])
    return _Claim(run, spec, profile, state, history, usage_id, owner)


def _drop_if_stale(conn: Any, run_id: str, version: int, outbox_id: int | None) -> None:
    """A message for a version the run has moved past will never be consumed: delete it."""
    if outbox_id is None:
        return
    run = repo.get_run(conn, run_id)
    if run is None or run["version"] != version or run["status"] not in ("queued", "running"):
        conn.execute(sa.delete(outbox).where(outbox.c.id == outbox_id))


def _release(rt: Runtime, run_id: str, version: int, owner: str, usage_id: int | None) -> None:
    """Give the round back after a transient error (a provider does not bill a 429/5xx)."""
    with rt.engine.begin() as conn:
        repo.release_round(conn, run_id, version, owner)
        if usage_id is not None:
            conn.execute(sa.delete(usage).where(usage.c.id == usage_id))


def _lease_keeper(rt: Runtime, run_id: str, version: int, owner: str) -> Any:
    """Keep the round's lease while the model call runs (the process's one renewer)."""
    return renewer_for(rt.engine, rt.settings.lease_seconds).hold(("round", run_id, version, owner))


def _drive(
    rt: Runtime, claim: _Claim, version: int, outbox_id: int | None, attempt: int
) -> RoundResult:
    run, spec = claim.run, claim.spec
    ts = repo.now()
    verdict = check_budgets(spec, claim.state, ts, run["deadline_at"])
    state = claim.state
    if verdict.stop_reason and not verdict.final_call:
        return _commit_final(
            rt,
            claim,
            version,
            outbox_id,
            Finish(stop_reason=verdict.stop_reason, text=state.last_text),
        )
    if verdict.final_call:
        state = replace(state, finalizing=verdict.stop_reason)
    if state.round == 0 and spec.router:
        routed = _try_route(rt, claim, version, outbox_id)
        if routed is not None:
            return routed
    catalog = build_catalog(spec, rt.profiles, attachments=attachment_refs(run["inputs"]))
    checkpoint = _maybe_checkpoint(rt, claim, version, catalog, attempt)
    history = claim.history + ([checkpoint.message] if checkpoint else [])
    req_spec, inputs = with_dataset_quotes(
        rt,
        run,
        spec,
        history,  # a chat's quotes (C-2)
        request_inputs(rt, run, claim.profile),
    )
    req = plan_request(
        req_spec,
        profile=claim.profile,
        state=state,
        messages=history,
        catalog=catalog.entries,
        plan=run["plan"],
        inputs=inputs,
    )
    reply, latency = _call_model(rt, claim, version, req, attempt)
    result = step(
        spec,
        state,
        reply,
        catalog.entries,
        run["plan"],
        call_cost=_price(claim.profile, reply),
        question=split_question(history)[1],
    )
    return _commit_step(rt, claim, version, outbox_id, reply, result, catalog, latency, checkpoint)


@dataclass(frozen=True)
class _Checkpoint:
    message: Message
    usage: dict[str, Any]


def _maybe_checkpoint(
    rt: Runtime, claim: _Claim, version: int, catalog: Catalog, attempt: int
) -> _Checkpoint | None:
    """SPEC L-8: over 80% of the window → one model call summarizes the run so far into a
    ``<context_checkpoint>``; later rounds send only system + checkpoint + what follows.
    A failed compression keeps the original messages."""
    spec, profile = claim.spec, claim.profile
    if spec.kind != "agent":
        return None
    schema_tokens = sum(
        estimate_tokens(json.dumps(e.parameters)) + estimate_tokens(e.description)
        for e in catalog.entries.values()
    )
    if not needs_checkpoint(
        claim.history, profile.context_window, profile.max_tokens, extra_tokens=schema_tokens
    ):
        return None
    plan = Plan.from_dict(claim.run["plan"]) if claim.run["plan"] else None
    active = plan if plan is not None and not plan.finished else None
    budget = max(1024, request_budget(profile.context_window, profile.max_tokens) // 2)
    msgs = checkpoint_request_messages(claim.history, active, budget_tokens=budget)
    req = RequestPlan(messages=tuple(msgs), max_tokens=profile.max_tokens)
    try:
        reply, latency = _call_model(rt, claim, version, req, attempt, live=False)
    except _FatalRound:
        log.warning("context checkpoint failed for %s; keeping the messages", claim.run["id"])
        return None
    summary = clean_checkpoint_summary(reply.text)
    if summary is None:
        return None
    cost = _price(profile, reply)
    usage_row = {
        "round": claim.state.round + 1,
        "purpose": "compress",
        "profile": profile.name,
        **_usage_values(claim, reply, cost, latency),
    }
    return _Checkpoint(checkpoint_message(summary, active), usage_row)


def _try_route(
    rt: Runtime, claim: _Claim, version: int, outbox_id: int | None
) -> RoundResult | None:
    question = next((m.text for m in reversed(claim.history) if m.role == "user"), "")
    rule = route(question, claim.spec.router)
    if rule is None or rule.pass_to_model or not rule.handler:
        return None
    text = run_handler(rule.handler, question)
    msg = Message(role="assistant", content=text)
    return _commit_final(
        rt, claim, version, outbox_id, Finish(stop_reason="routed", text=text), extra_messages=[msg]
    )


def _to_model_request(req: RequestPlan) -> ModelRequest:
    return ModelRequest(
        messages=req.messages,
        tools=tuple(ToolDef(t.name, t.description, t.parameters) for t in req.tools),
        tool_choice=req.tool_choice,
        max_tokens=req.max_tokens,
        response_format=req.response_format,
    )


def _call_model(
    rt: Runtime, claim: _Claim, version: int, req: RequestPlan, attempt: int, live: bool = True
) -> tuple[Reply, int]:
    run_id = claim.run["id"]
    model = make_model(claim.profile)

    offsets = {"text": 0, "reasoning": 0}  # characters of this call's reply so far, per kind

    def on_delta(d: Delta) -> None:
        # SPEC C-4: reasoning and answer deltas each stream behind their flag
        streamed = d.kind in ("text", "reasoning") and stream_enabled(claim.spec, d.kind)
        if live and streamed and d.text:
            # offset: where the piece starts in the reply (facades number deltas by it)
            rt.live.publish(
                run_id,
                {
                    "type": f"{d.kind}.delta",
                    "data": {
                        "text": d.text,
                        "round": claim.state.round + 1,
                        "offset": offsets[d.kind],
                    },
                },
            )
        if d.kind in offsets:
            offsets[d.kind] += len(d.text or "")

    key, limits = limit_key(claim.profile), limits_of(claim.profile)
    tokens = sum(estimate_tokens(m.text) for m in req.messages) + (req.max_tokens or 0)
    permit = rt.limiter.acquire(key, limits, tokens, claim.profile.timeout_total)
    if not permit.granted:  # fleet capacity: give the thread back, come back later
        raise RetryRound(permit.wait, "capacity", counts=False)
    started = repo.now()
    try:
        with _lease_keeper(rt, run_id, version, claim.owner):
            reply = model.complete(_to_model_request(req), on_delta)
    except TransientModelError as exc:
        if exc.status == 429 and exc.retry_after:
            rt.limiter.pause(key, exc.retry_after)  # the whole fleet holds off this profile
        _raise_retry(rt, claim, version, exc, attempt)
        raise  # unreachable: _raise_retry always raises
    except FatalModelError as exc:
        raise _FatalRound(str(exc)) from exc
    finally:
        rt.limiter.release(permit)
    _count_model(claim.profile, reply, repo.now() - started)
    return reply, int((repo.now() - started) * 1000)


def _count_model(profile: ModelProfile, reply: Reply, seconds: float) -> None:
    metrics.ROUND_SECONDS.labels(phase="model").observe(seconds)
    if reply.usage is not None:
        name = limit_key(profile)
        metrics.MODEL_TOKENS.labels(profile=name, direction="input").inc(reply.usage.input_tokens)
        metrics.MODEL_TOKENS.labels(profile=name, direction="output").inc(reply.usage.output_tokens)
        metrics.MODEL_COST.labels(profile=name).inc(_price(profile, reply))


def limit_key(profile: ModelProfile) -> str:
    """Limits are per named profile; inline profiles share them per endpoint and model."""
    if profile.name != "inline":
        return profile.name
    return f"{profile.base_url}|{profile.model}"


class _FatalRound(Exception):
    pass


def _raise_retry(
    rt: Runtime, claim: _Claim, version: int, exc: TransientModelError, attempt: int
) -> None:
    from shared.llm.backoff import backoff_delay

    limit = (
        claim.profile.max_retries
        if claim.profile.max_retries is not None
        else rt.settings.model_max_retries
    )
    delay = backoff_delay(attempt, retry_after=exc.retry_after)
    deadline = claim.run["deadline_at"]
    if attempt >= limit or (deadline is not None and repo.now() + delay >= deadline):
        raise _FatalRound(f"model call failed after {attempt + 1} attempts: {exc}") from exc
    raise RetryRound(delay, str(exc)) from exc


def _price(profile: ModelProfile, reply: Reply) -> float:
    """SPEC M-9: each call priced on its own (a continued reply holds several calls)."""
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


def _usage_values(claim: _Claim, reply: Reply, cost: float, latency: int) -> dict[str, Any]:
    u = reply.usage
    return {
        "input_tokens": u.input_tokens if u else 0,
        "output_tokens": u.output_tokens if u else 0,
        "cached_input_tokens": u.cached_input_tokens if u else 0,
        "estimated": u.estimated if u else True,
        "cost": cost,
        "latency_ms": latency,
        "committed": True,
        "model": reply.raw_model or claim.profile.model or claim.profile.name,
    }


def _commit_step(
    rt: Runtime,
    claim: _Claim,
    version: int,
    outbox_id: int | None,
    reply: Reply,
    result: StepResult,
    catalog: Catalog,
    latency: int,
    checkpoint: _Checkpoint | None = None,
) -> RoundResult:
    run_id, ts = claim.run["id"], repo.now()
    round_ = result.state.round
    changes = repo.Changes()
    if checkpoint is not None:
        changes.message(checkpoint.message, round_)
        changes.usage.append(checkpoint.usage)
        changes.values["view_start"] = claim.run["msg_seq"] + 1
        changes.values["cost"] = result.state.cost + checkpoint.usage["cost"]
    changes.message(result.message, round_)
    changes.values = {
        **_totals(result.state),
        **changes.values,
        "plan": result.plan,
        "round": round_,
    }
    if result.plan != claim.run["plan"]:
        changes.event("plan.updated", plan=result.plan)
    tool_rows: list[dict[str, Any]] = []
    decision = result.decision
    if isinstance(decision, RunTools):
        tool_rows = _tool_rows(claim, decision, catalog, round_, ts)
        _dispatch_or_settle(claim, changes, decision, tool_rows, round_, ts)
    elif isinstance(decision, (Finish, Fail)):
        settle(changes, decision, run_id=run_id, round_=round_, ts=ts)
    with rt.engine.begin() as conn:
        applied = threads.apply_final(
            conn,
            run_id,
            version,
            changes,
            thread_id=claim.run["thread_id"],
            redrive_after=rt.settings.redrive_seconds,
            ts=ts,
        )
        if applied is None:
            return RoundResult("lost")
        if tool_rows:
            conn.execute(sa.insert(tool_calls), tool_rows)
        _finish_usage(conn, claim, reply, result.state.cost - claim.state.cost, latency)
        repo.delete_outbox(conn, outbox_id)
    rt.publish(applied.outbox_ids)
    if applied.events:
        rt.wake(run_id, applied.row["event_seq"])
    return RoundResult("committed", type(decision).__name__)


def _finish_usage(conn: Any, claim: _Claim, reply: Reply, cost: float, latency: int) -> None:
    if claim.usage_id is not None:
        conn.execute(
            sa.update(usage)
            .where(usage.c.id == claim.usage_id)
            .values(**_usage_values(claim, reply, cost, latency))
        )


def _totals(state: LoopState) -> dict[str, Any]:
    loop = state.to_dict()
    return {
        "loop": loop,
        "cost": state.cost,
        "input_tokens": state.input_tokens,
        "output_tokens": state.output_tokens,
    }


def _tool_rows(
    claim: _Claim, decision: RunTools, catalog: Catalog, round_: int, ts: float
) -> list[dict[str, Any]]:
    budget = tool_result_budget(claim.profile.context_window, claim.spec.tool_result_max_tokens)
    rows = []
    for c in decision.calls:
        rows.append(
            {
                "run_id": claim.run["id"],
                "call_id": c.call_id,
                "round": round_,
                "idx": c.index,
                "name": c.name,
                "arguments": c.arguments,
                "read_only": c.read_only,
                "status": c.status,
                "result": c.result,
                "result_for_model": reduce_tool_result(c.result, budget)
                if c.result is not None
                else None,
                "finished_at": ts if c.status == "done" else None,
                "flushed": False,
            }
        )
    return rows


def _dispatch_or_settle(
    claim: _Claim,
    changes: repo.Changes,
    decision: RunTools,
    rows: list[dict[str, Any]],
    round_: int,
    ts: float,
) -> None:
    """Queue the first window of external calls, or settle at once when there are none."""
    run_id = claim.run["id"]
    pending = [r for r in rows if r["status"] == "pending"]
    if pending:
        window = claim.spec.effective_parallel_tools
        for r in pending[:window]:
            r["status"] = "queued"
            changes.outbox.append(("tool", {"call_id": r["call_id"]}))
        changes.values.update(
            status="running",
            open_calls=len(pending),
            after_join=encode_after(decision.then),
            lease_until=None,
            lease_owner=None,
        )
        return
    msgs, flushed = flush_calls(rows)
    for r in rows:
        if r["call_id"] in flushed:
            r["flushed"] = True
    for m in msgs:
        changes.message(m, round_)
    settle(
        changes,
        decision.then,
        run_id=run_id,
        round_=round_,
        ts=ts,
        ask_timeout_s=claim.spec.ask_timeout_s,
    )


def _commit_final(
    rt: Runtime,
    claim: _Claim,
    version: int,
    outbox_id: int | None,
    finish: Finish,
    extra_messages: list[Message] | None = None,
) -> RoundResult:
    """End the run without a model call (budget exhausted, routed)."""
    ts = repo.now()
    changes = repo.Changes()
    for m in extra_messages or []:
        changes.message(m, claim.state.round)
    settle(changes, finish, run_id=claim.run["id"], round_=claim.state.round, ts=ts)
    with rt.engine.begin() as conn:
        applied = threads.apply_final(
            conn,
            claim.run["id"],
            version,
            changes,
            thread_id=claim.run["thread_id"],
            redrive_after=rt.settings.redrive_seconds,
            ts=ts,
        )
        if applied is None:
            return RoundResult("lost")
        if claim.usage_id is not None:  # no model call was made
            conn.execute(sa.delete(usage).where(usage.c.id == claim.usage_id))
        repo.delete_outbox(conn, outbox_id)
    rt.publish(applied.outbox_ids)
    rt.wake(claim.run["id"], applied.row["event_seq"])
    return RoundResult("committed", "Finish")


def fail_round(rt: Runtime, run_id: str, version: int, outbox_id: int | None, message: str) -> None:
    """A fatal model error: the run fails with the provider's message."""
    ts = repo.now()
    changes = repo.Changes()
    settle(changes, Fail(reason=message, code="model_error"), run_id=run_id, round_=0, ts=ts)
    with rt.engine.begin() as conn:
        run = repo.get_run(conn, run_id)
        thread_id = run["thread_id"] if run is not None else None
        applied = threads.apply_final(
            conn,
            run_id,
            version,
            changes,
            thread_id=thread_id,
            redrive_after=rt.settings.redrive_seconds,
            ts=ts,
        )
        if applied is None:
            return
        repo.delete_outbox(conn, outbox_id)
    rt.publish(applied.outbox_ids)  # webhooks for run.failed
    rt.wake(run_id, applied.row["event_seq"])
