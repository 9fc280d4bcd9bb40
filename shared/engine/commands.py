"""What the API does to runs: submit, cancel, answer an ask, approve writes, expire an ask.
Each is one transition (``shared.engine.transition``), read again and retried while it loses a
race, then a dispatch of what it queued."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy.exc import IntegrityError

from shared import tracing
from shared.agent import ask as ask_mod
from shared.agent.approval import (
    ApprovalError,
    ItemDecision,
    Resolved,
    decisions_from_lists,
    note_message,
    resolve_approval,
    same_decisions,
)
from shared.agent.attachments import attachment_refs
from shared.agent.decisions import Continue, Fail
from shared.agent.messages import Message
from shared.agent.spec import AgentSpec, WebhookSpec
from shared.engine import admission, threads, toolkit
from shared.engine.attachments import resolve_attachments
from shared.engine.catalog import build_catalog
from shared.engine.change import Change, LostRace, flush, settle
from shared.engine.knowledge import check_sources
from shared.engine.memory import check_run_memory
from shared.engine.resume import pause_is_current, spend_resume_token
from shared.engine.runtime import Runtime
from shared.engine.transition import retrying
from shared.engine.tx import Tx
from shared.errors import Conflict, NotFound, SpecError
from shared.store import ancestry
from shared.store import calls as call_store
from shared.store import runs as run_store
from shared.store import threads as thread_store
from shared.store.db import reading
from shared.store.deliveries import DURABLE_EVENTS
from shared.store.rows import FINAL, Call, CallStatus, Run, RunRecord, Status
from shared.store.write import Closing
from shared.vocab import EventType

__all__ = [
    "CANCELLED_TEXT",
    "FINAL",
    "RunInput",
    "answer_run",
    "approve_run",
    "cancel_run",
    "expire_ask",
    "input_messages",
    "new_id",
    "repair_calls",
    "submit_run",
]

CANCELLED_TEXT = "Cancelled: the run was cancelled before this call finished."


@dataclass
class RunInput:
    agent: AgentSpec
    input: str | list[dict[str, Any]]
    tenant: str = "default"
    thread_id: str | None = None
    idempotency_key: str | None = None
    metadata: dict[str, Any] | None = None
    webhook: WebhookSpec | None = None
    inputs: dict[str, Any] = field(default_factory=dict)  # quotes, attachments
    parent_run_id: str | None = None
    parent_call_id: str | None = None
    agent_ref: str | None = None  # the named agent it runs: "name", or "name@version"
    run_at: float | None = None  # scheduled: not started before this time (epoch seconds)
    priority: int = 5  # 0-9: its dispatches' broker priority
    ttl_s: float | None = None  # retention: purged this long after it ended
    cron_id: str | None = None  # fired by this cron: its spend envelope counts the run too

    @property
    def spend_keys(self) -> list[str] | None:
        """The spend envelopes the run counts against besides its tenant's."""
        keys = [f"agent:{self.agent_ref.split('@', 1)[0]}"] if self.agent_ref else []
        keys += [f"cron:{self.cron_id}"] if self.cron_id else []
        return keys or None


def input_messages(value: str | list[dict[str, Any]]) -> list[Message]:
    """A run's input as messages: a text, or messages whose last is the user's (not empty)."""
    if isinstance(value, str):
        if not value.strip():
            raise SpecError("input must not be empty")
        return [Message(role="user", content=value)]
    if not value:
        raise SpecError("input must not be empty")
    msgs = [Message.from_dict({"content": "", **m}) for m in value]
    if msgs[-1].role != "user":
        raise SpecError("the last input message must have role 'user'")
    return msgs


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def webhook_config(rt: Runtime, req: RunInput) -> dict[str, Any] | None:
    """The run's webhook: its own, else the default tenant's (``TREADLE_WEBHOOK_URL``) for a
    top-level run. Unknown event names are refused (deltas are live only, never webhooks)."""
    if req.webhook is not None:
        if not req.webhook.url.startswith(("http://", "https://")):
            raise SpecError("webhook.url must be an http(s) URL")
        unknown = sorted(set(req.webhook.events or ()) - DURABLE_EVENTS - {"*"})
        if unknown:
            raise SpecError(
                f"webhook.events: unknown event types {', '.join(unknown)}; "
                f"one of {', '.join(sorted(DURABLE_EVENTS))} or '*'"
            )
        return req.webhook.model_dump()
    url = rt.settings.webhook_url
    if url and req.tenant == "default" and req.parent_run_id is None:
        return {"url": url, "events": None, "secret_env": rt.settings.webhook_secret_env}
    return None


# --- submit --------------------------------------------------------------------------------------


def submit_run(
    rt: Runtime, req: RunInput, *, also: Callable[[Tx, str], None] | None = None
) -> tuple[RunRecord, bool]:
    """Create a queued run and dispatch its first round; an Idempotency-Key replay returns the
    run it created the first time (``created`` False). ``also(tx, run_id)`` runs first in the
    transaction that creates the run (a cron's slot claim): what it raises rolls it back."""
    msgs = input_messages(req.input)
    # unknown tools, bad inline tools: a clear error now, not mid-run; what the catalog drops
    # (a tool named like an internal one, SPEC P-5) is a warning stored on the run
    warnings = list(build_catalog(req.agent).warnings)
    check_sources(rt, req.tenant, req.agent, req.inputs)  # the datasets it names exist
    check_run_memory(rt, req.agent, req.metadata)  # its memory namespace can be filled
    if req.idempotency_key is not None:
        found = _idempotent(rt, req)
        if found is not None:
            return found, False
    if req.inputs.get("attachments"):  # M-11: ids must exist; data URLs become files
        refs = resolve_attachments(rt, req.tenant, req.inputs["attachments"])
        req = replace(req, inputs={**req.inputs, "attachments": refs})
    run_id = new_id("run")
    try:
        retrying(rt, lambda tx: _create(tx, req, run_id, msgs, warnings, also))
    except IntegrityError:
        found = _idempotent(rt, req) if req.idempotency_key is not None else None
        if found is None:
            raise
        return found, False
    with reading(rt.engine) as conn:
        record = run_store.get_run(conn, run_id)
    assert record is not None
    return record, True


def _idempotent(rt: Runtime, req: RunInput) -> RunRecord | None:
    assert req.idempotency_key is not None
    with reading(rt.engine) as conn:
        return run_store.find_idempotent(conn, req.tenant, req.idempotency_key)


def _create(
    tx: Tx,
    req: RunInput,
    run_id: str,
    msgs: list[Message],
    warnings: list[str],
    also: Callable[[Tx, str], None] | None = None,
) -> None:
    """Insert the run and dispatch its first round. On a thread it starts with the thread's
    history, or is held (no round yet) behind the active run."""
    if also is not None:
        also(tx, run_id)
    admitted = _admit(tx, req, run_id) if req.thread_id else None
    ts = admitted.stamp if admitted is not None and admitted.stamp else tx.ts
    scheduled = req.run_at is not None and req.run_at > tx.ts and req.thread_id is None
    start = req.run_at if scheduled and req.run_at is not None else ts
    row = _run_row(tx, req, run_id, start, scheduled)
    held = admitted is not None and admitted.held
    # over its tenant's limit of runs in flight: waits in the database (shared.engine.admission)
    gated = not scheduled and admitted is None and req.parent_run_id is None
    gated = gated and admission.gate(tx, req.tenant)
    inputs, first = _starting_point(req, msgs, admitted, row)
    if gated:
        row["held"] = True
    tx.rt.store.insert_run(tx.conn, row, _run_spec(req, run_id, inputs, warnings), first, ts)
    run = run_store.load_run(tx.conn, run_id)
    assert run is not None
    change = Change(run, bump=False, queue_round=not held and not scheduled and not gated)
    extra: dict[str, Any] = {"held": True} if held or gated else {}
    if scheduled:
        extra["run_at"] = start
    change.event(EventType.RUN_QUEUED, kind=req.agent.kind, **extra)
    tx.apply(change)


def _run_row(tx: Tx, req: RunInput, run_id: str, start: float, scheduled: bool) -> dict[str, Any]:
    """The new run's columns: queued, or scheduled to wake at ``start``; its deadline counts
    from ``start``."""
    deadline = start + req.agent.budget.deadline_s if req.agent.budget.deadline_s else None
    return {
        "id": run_id,
        "tenant": req.tenant,
        "kind": req.agent.kind,
        "status": (Status.SCHEDULED if scheduled else Status.QUEUED).value,
        "wake_at": start if scheduled else None,
        "priority": req.priority,
        "ttl_s": req.ttl_s,
        "thread_id": req.thread_id,
        "idempotency_key": req.idempotency_key,
        "spend_keys": req.spend_keys,
        "webhook": webhook_config(tx.rt, req),
        "deadline_at": deadline,
        "parent_run_id": req.parent_run_id,
        "parent_call_id": req.parent_call_id,
    }


def _starting_point(
    req: RunInput,
    msgs: list[Message],
    admitted: threads.Admission | None,
    row: dict[str, Any],
) -> tuple[dict[str, Any], list[Message]]:
    """The run's inputs and first messages. Held behind a thread's active run: no messages
    yet (they wait in its inputs) and ``row`` marked held; otherwise ``row`` takes its
    thread's history (if any)."""
    if admitted is not None and admitted.held:
        row["held"] = True
        return {**req.inputs, threads.QUEUED_INPUT: [m.to_dict() for m in msgs]}, []
    row.update(admitted.base if admitted is not None else {})  # its thread's history
    return (admitted.inputs if admitted is not None else dict(req.inputs)), msgs


def _run_spec(
    req: RunInput, run_id: str, inputs: dict[str, Any], warnings: list[str]
) -> dict[str, Any]:
    """The run's stored spec: the agent, its inputs, metadata and warnings."""
    return {
        "agent": req.agent.model_dump(mode="json", exclude_none=True),
        "inputs": inputs or None,
        "meta": req.metadata,
        "warnings": warnings or None,
        "agent_ref": req.agent_ref,
        "trace": tracing.stamp_run(run_id),  # the request's trace: the run's rounds join it
    }


def _admit(tx: Tx, req: RunInput, run_id: str) -> threads.Admission:
    """One active run per thread; on a busy thread the thread's ``multitask`` policy decides:
    reject (409), enqueue (held until the active run ends) or interrupt (cancel it, start)."""
    assert req.thread_id is not None
    thread = tx.lock_thread(req.thread_id, req.tenant)  # first: lock order
    stamp = float(thread["updated_at"])  # grows with each lock: the thread's run order
    active = thread_store.active_run(tx.conn, req.thread_id)
    if active is not None or thread_store.next_held(tx.conn, req.thread_id) is not None:
        policy = thread["multitask"]
        if policy == "reject":
            busy = f"run {active.id}" if active is not None else "queued runs"
            raise Conflict(f"thread {req.thread_id} is busy with {busy}")
        if policy == "enqueue" or active is None:
            return threads.Admission(held=True, stamp=stamp)
        _cancel(tx, active, release=False, interrupted_by=run_id)
    return threads.Admission(
        stamp=stamp,
        base=threads.base_of(tx.conn, req.thread_id, run_id),
        inputs=threads.start_inputs(tx.conn, req.thread_id, req.agent.kind, req.inputs),
    )


# --- cancel --------------------------------------------------------------------------------------


def cancel_run(rt: Runtime, tenant: str, run_id: str) -> RunRecord:
    def op(tx: Tx) -> RunRecord:
        run = tx.run(run_id, tenant)
        if run.final:
            raise Conflict(f"run {run_id} is already {run.status}")
        _cancel(tx, run)
        return tx.record(run_id)

    return retrying(rt, op)


def _cancel(tx: Tx, run: Run, *, release: bool = True, **event: Any) -> Run:
    """Cancel a non-final run: every dangling tool call gets a tool message, its active
    children are cancelled too (same transaction). On a thread (``release``) the thread's
    next held run starts. A child's parent sees it end (its call gets the cancellation)."""
    tx.prepare(run, ending=release, tells_parent=True)
    change = repair_calls(tx, run, CANCELLED_TEXT)
    change.values.update(
        status=Status.CANCELLED.value,
        stop_reason="cancelled",
        pending=None,
        after_join=None,
        open_calls=0,
        lease_owner=None,
        wake_at=None,
    )
    change.event(EventType.RUN_CANCELLED, **event)
    change.release_thread = release  # an interrupting submit starts the thread's next run
    new = tx.apply(change)
    kids = ancestry.active_children(tx.conn, run.id)
    for child in kids:
        _cancel(tx, child, cascaded_from=run.id)
    # the children's spending so far joins the parent's totals (no join will bring it now)
    spent = sum(c.cost for c in (run_store.load_run(tx.conn, k.id) for k in kids) if c is not None)
    if spent:
        new = tx.apply(Change(new, bump=False, values={"cost": new.cost + spent}))
    tx.stopped.append(run.id)
    return new


def repair_calls(tx: Tx, run: Run, text: str) -> Change:
    """A change that gives every tool call left without a result its tool message, ``text``
    (no dangling call survives: the transcript is valid for providers)."""
    calls = call_store.list_tool_calls(tx.conn, run.id)
    open_ids = [c.call_id for c in calls if c.status != CallStatus.DONE]
    values = {
        "status": CallStatus.DONE.value,
        "result": text,
        "result_for_model": text,
        "finished_at": tx.ts,
        "lease_owner": None,
    }
    if open_ids:
        call_store.set_calls(tx.conn, run.id, open_ids, values)
    closed = [_with(c, values) if c.call_id in open_ids else c for c in calls]
    return _flushed(tx, run, closed, run.round)


def _with(call: Call, values: dict[str, Any]) -> Call:
    return replace(call, **{**values, "status": CallStatus(values["status"])})


def _flushed(
    tx: Tx,
    run: Run,
    calls: Sequence[Call],
    round_: int,
    closing: tuple[str, dict[str, Any]] | None = None,
) -> Change:
    """A change that appends the tool messages of finished, unflushed calls in order.
    ``closing``: a call this change closes, and its values (``calls`` shows it closed): its
    row is closed and flushed in one UPDATE."""
    msgs, ids = flush(calls)
    change = Change(run)
    if closing is not None:  # set with the run's UPDATE (one statement)
        call_id, values = closing
        change.closes.append(Closing([call_id], {**values, "flushed": call_id in ids}))
        ids = [i for i in ids if i != call_id]
    if ids:
        change.closes.append(Closing(ids, {"flushed": True}))
    for m in msgs:
        change.message(m, round_)
    return change


# --- answers and approvals -----------------------------------------------------------------------


def _load_for(
    tx: Tx, tenant: str | None, run_id: str, token: str | None, kind: str, pause_id: str
) -> RunRecord:
    """Load the run (as the API shows it); with a resume token, spend it first (401/409, see
    shared.engine.resume). ``tenant`` None: any tenant's run (the token, not an API key, names
    the run)."""
    _spend(tx, run_id, token, kind, pause_id)
    return _checked(run_store.get_run(tx.conn, run_id, tenant), run_id, token, kind, pause_id)


def _spend(tx: Tx, run_id: str, token: str | None, kind: str, pause_id: str) -> None:
    if token is not None:
        spend_resume_token(tx.conn, token, run_id=run_id, kind=kind, pause_id=pause_id, ts=tx.ts)


def _checked(
    record: RunRecord | None, run_id: str, token: str | None, kind: str, pause_id: str
) -> RunRecord:
    if record is None:
        raise NotFound(f"run {run_id} not found")
    if token is not None and not pause_is_current(record.pending, record.status, kind, pause_id):
        raise Conflict(f"run {run_id} is no longer waiting on {kind} {pause_id}")
    return record


def _pause_owner(tx: Tx, run: Run, key: str) -> Run:
    """The run that owns the pause ``run`` shows: itself, or the descendant whose ask or
    approval it surfaces (``pending.run_id``). LostRace: that run moved on (read again)."""
    pending = run.pending or {}
    target_id = pending.get("run_id")
    if not target_id:
        return run
    target = run_store.load_run(tx.conn, target_id, run.tenant)
    if (
        target is None
        or target.status != Status.WAITING
        or (target.pending or {}).get(key) != pending.get(key)
    ):
        raise LostRace(run.id)
    return target


def answer_run(
    rt: Runtime,
    tenant: str | None,
    run_id: str,
    ask_id: str,
    answers: list[str],
    token: str | None = None,
) -> RunRecord:
    """A-3: the answer becomes the ask's tool message; the next round is dispatched.
    ``token``: a resume token instead of an API key (single use, this ask only)."""

    def op(tx: Tx) -> RunRecord:
        _spend(tx, run_id, token, "ask", ask_id)
        found = tx.rt.store.run_and_round(tx.conn, run_id, tenant, ask_id)  # one read
        record = _checked(found and found[0], run_id, token, "ask", ask_id)
        run, ask_round = record.run, found[1] if found else []
        pending = run.pending or {}
        if run.status != Status.WAITING or pending.get("kind") != "ask":
            _already_answered(tx, run, ask_id, answers)
            return record
        if pending.get("ask_id") != ask_id:
            raise Conflict(f"run {run_id} is waiting on ask {pending.get('ask_id')}, not {ask_id}")
        owner = _pause_owner(tx, run, "ask_id")
        text = ask_mod.render_answer(ask_mod.Ask.from_dict(owner.pending or {}), answers)
        beside = ask_round if owner is run else None  # a descendant's ask: read its round
        new = _finish_ask(tx, owner, ask_id, text, {"answers": answers}, beside)
        # the run's own ask: its new row is the whole change (a descendant's changed it too)
        return replace(record, run=new) if owner is run else tx.record(run_id)

    return retrying(rt, op)


def _already_answered(tx: Tx, run: Run, ask_id: str, answers: list[str]) -> None:
    call = call_store.get_call(tx.conn, run.id, ask_id) or _descendant_call(tx, run.id, ask_id)
    answered = call is not None and call.status == CallStatus.DONE
    if answered and call is not None and (call.data or {}).get("answers") == answers:
        return  # the same answer again: idempotent
    raise Conflict(f"run {run.id} is {run.status}, not waiting on ask {ask_id}")


def _descendant_call(tx: Tx, run_id: str, call_id: str) -> Call | None:
    """A call of a run below ``run_id`` (a pause answered through an ancestor)."""
    for rid in ancestry.descendant_ids(tx.conn, run_id):
        call = call_store.get_call(tx.conn, rid, call_id)
        if call is not None:
            return call
    return None


def _finish_ask(
    tx: Tx,
    run: Run,
    ask_id: str,
    text: str,
    data: dict[str, Any],
    beside: list[Call] | None = None,
) -> Run:
    """The ask's call answered with ``text``; ``beside``: its round's calls, when read."""
    tx.prepare(run, ending=False, tells_parent=True)
    if beside is None:
        beside = call_store.round_of_call(tx.conn, run.id, ask_id)
    call = next((c for c in beside if c.call_id == ask_id), None)
    if call is None:
        raise Conflict(f"ask {ask_id} has no tool call")
    values = {
        "status": CallStatus.DONE.value,
        "result": text,
        "result_for_model": text,
        "data": data,
        "finished_at": tx.ts,
    }
    calls = [_with(c, values) if c.call_id == ask_id else c for c in beside]
    change = _flushed(tx, run, calls, call.round, closing=(ask_id, values))
    settle(change, Continue(), ts=tx.ts)
    change.event(EventType.RUN_RESUMED)
    return tx.apply(change)


def expire_ask(rt: Runtime, run_id: str) -> None:
    """A-4: an expired ask is answered ``(no answer: timed out)`` or fails the run."""

    def op(tx: Tx) -> None:
        run = run_store.load_run(tx.conn, run_id)
        if run is None or run.status != Status.WAITING or (run.pending or {}).get("kind") != "ask":
            return
        spec = tx.rt.caches.spec_of(tx.conn, run_id, loop=run.loop)
        if spec.ask_timeout_action == "fail":
            tx.prepare(run, ending=True, tells_parent=True)
            change = repair_calls(tx, run, ask_mod.TIMEOUT_TEXT)
            settle(
                change,
                Fail(reason="the ask expired without an answer", code="ask_timeout"),
                ts=tx.ts,
            )
            tx.apply(change)
            return
        ask_id = (run.pending or {})["ask_id"]
        _finish_ask(tx, run, ask_id, ask_mod.TIMEOUT_TEXT, {"timed_out": True})

    retrying(rt, op)


def approve_run(
    rt: Runtime,
    tenant: str | None,
    run_id: str,
    approval_id: str,
    approve: list[str] | str | None = None,
    reject: list[str] | None = None,
    note: str | None = None,
    token: str | None = None,
    *,
    decisions: Sequence[ItemDecision] | None = None,
    by: str | None = None,
) -> RunRecord:
    """N-4: each proposed write is approved (it runs), edited (it runs with the arguments the
    person gave, checked against the tool's schema) or rejected (the model reads ``Declined by
    user[: message]``); then a summary round, where the model also reads the ``note``.
    ``decisions`` per item, or the list form (``approve: [ids] | "all"``, ``reject``): an item
    not approved is rejected. ``by``: who decided (an API key id, or the resume token's
    holder), recorded on each call and in ``run.resumed``. ``token``: a resume token.
    An approval already decided: the same decisions again answer as the first time did, other
    decisions are a ``Conflict`` (409), like a second, different answer to an ask."""
    given = (decisions, approve, reject)

    def op(tx: Tx) -> RunRecord:
        record = _load_for(tx, tenant, run_id, token, "approval", approval_id)
        run = record.run
        pending = run.pending or {}
        if run.status != Status.WAITING or pending.get("kind") != "approval":
            _already_approved(tx, run, approval_id, lambda items: _decisions(items, *given))
            return record
        if pending.get("approval_id") != approval_id:
            raise Conflict(f"run {run_id} is waiting on approval {pending.get('approval_id')}")
        owner = _pause_owner(tx, run, "approval_id")
        items = (owner.pending or {})["items"]
        chosen = _decisions(items, decisions, approve, reject)
        resolved = _resolve(tx, owner, items, chosen)
        _apply_approval(tx, owner, resolved, approval_id, note, by)
        return tx.record(run_id)

    return retrying(rt, op)


def _decisions(
    items: Sequence[Mapping[str, Any]],
    decisions: Sequence[ItemDecision] | None,
    approve: list[str] | str | None = None,
    reject: list[str] | None = None,
) -> Sequence[ItemDecision]:
    if decisions is not None:
        if approve is not None or reject:
            raise SpecError("give either decisions or approve/reject, not both")
        return decisions
    if approve is None:
        raise SpecError('give decisions, or approve (a list of call ids or "all")')
    try:
        return decisions_from_lists([str(i["call_id"]) for i in items], approve, reject)
    except ApprovalError as exc:
        raise SpecError(str(exc)) from None


def _resolve(
    tx: Tx, run: Run, items: Sequence[Mapping[str, Any]], chosen: Sequence[ItemDecision]
) -> tuple[Resolved, ...]:
    given = tx.rt.caches.given(tx.conn, run.id)
    refs = attachment_refs(given.inputs)
    catalog = toolkit.catalog(tx.rt, run.id, given.serving(run.loop), refs, tenant=run.tenant)
    schemas = {name: entry.parameters for name, entry in catalog.entries.items()}
    try:
        return resolve_approval(items, chosen, schemas)
    except ApprovalError as exc:
        raise SpecError(str(exc)) from None


def _already_approved(
    tx: Tx,
    run: Run,
    approval_id: str,
    chosen: Callable[[Sequence[Mapping[str, Any]]], Sequence[ItemDecision]],
) -> None:
    """An approval already decided: its calls (the run's, or for an approval answered
    through it, a descendant's) carry its id and the decision taken on each. The same
    decisions again are idempotent; others (``chosen`` from the calls as items) are a
    Conflict, and so is an approval no call carries."""
    for rid in [run.id, *ancestry.descendant_ids(tx.conn, run.id)]:
        calls = [
            c
            for c in call_store.list_tool_calls(tx.conn, rid)
            if (c.data or {}).get("approval_id") == approval_id
        ]
        if not calls:
            continue
        recorded = {c.call_id: _decision_of(c) for c in calls}
        if same_decisions(recorded, chosen([{"call_id": c.call_id} for c in calls])):
            return
        raise Conflict(f"approval {approval_id} of run {run.id} was already decided otherwise")
    raise Conflict(f"run {run.id} is {run.status}, not waiting on approval {approval_id}")


def _decision_of(call: Call) -> Mapping[str, Any]:
    data = call.data or {}
    recorded = data.get("decision")
    if isinstance(recorded, Mapping):
        return recorded
    return {"action": "approve" if data.get("approved") else "reject"}


def _apply_approval(
    tx: Tx,
    run: Run,
    resolved: Sequence[Resolved],
    approval_id: str,
    note: str | None,
    by: str | None,
) -> Run:
    tx.prepare(run, ending=False, tells_parent=True)
    spec = tx.rt.caches.spec_of(tx.conn, run.id, loop=run.loop)
    running = [r.call_id for r in resolved if r.run]
    window = running[: spec.effective_parallel_tools]
    records = [r.record(by, tx.ts) for r in resolved]
    for r, record in zip(resolved, records, strict=True):
        values = _decided(r, record, approval_id, r.call_id in window, tx.ts)
        call_store.set_calls(tx.conn, run.id, [r.call_id], values)
    calls = call_store.list_tool_calls(tx.conn, run.id)
    round_ = next(c.round for c in calls if c.call_id == resolved[0].call_id)
    batch = [c for c in calls if c.round == round_]
    event = {"decisions": records, "note": note, "by": by}
    if not running:  # all rejected: the tool messages, the note, then the summary round
        change = _flushed(tx, run, batch, round_)
        noted = note_message(note)
        if noted is not None:
            change.message(noted, round_)
        settle(change, Continue(), ts=tx.ts)
        change.event(EventType.RUN_RESUMED, **event)
        return tx.apply(change)
    change = Change(run)
    after: dict[str, Any] = {"type": "continue", "calls": len(batch)}
    if note_message(note) is not None:
        after["note"] = note  # appended after the batch's tool messages, at the join
    change.values.update(
        status=Status.RUNNING.value, pending=None, open_calls=len(running), after_join=after
    )
    change.event(EventType.RUN_RESUMED, **event)
    change.queue_tools += window
    return tx.apply(change)


def _decided(
    r: Resolved, record: dict[str, Any], approval_id: str, queued: bool, ts: float
) -> dict[str, Any]:
    """A decided call's new columns: declined, its result is its tool message (done);
    approved, it is queued (in the first window) or pending; edited, its new arguments."""
    values: dict[str, Any] = {
        "data": {"approval_id": approval_id, "approved": r.run, "decision": record}
    }
    if not r.run:
        values.update(
            status=CallStatus.DONE.value,
            result=r.result,
            result_for_model=r.result,
            finished_at=ts,
        )
    elif queued:
        values.update(status=CallStatus.QUEUED.value, queued_at=ts)
    else:
        values.update(status=CallStatus.PENDING.value)
    if r.action == "edit":
        values["arguments"] = r.arguments
    return values
