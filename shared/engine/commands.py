"""What the API does to runs: submit, cancel, answer an ask, approve writes. Each is one
guarded transaction (retried when it loses a race), then a publish of what it queued."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, RowMapping
from sqlalchemy.exc import IntegrityError

from shared.agent import ask as ask_mod
from shared.agent.decisions import Continue, Fail
from shared.agent.messages import Message
from shared.agent.spec import AgentSpec, WebhookSpec
from shared.engine import children, threads
from shared.engine.afters import flush_calls, settle
from shared.engine.attachments import resolve_attachments
from shared.engine.catalog import build_catalog
from shared.engine.knowledge import check_sources
from shared.engine.resume import pause_is_current, spend_resume_token
from shared.engine.runtime import OutboxItem, Runtime
from shared.errors import Conflict, NotFound, SpecError
from shared.store import repo
from shared.store import threads as thread_store
from shared.store.deliveries import DURABLE_EVENTS
from shared.store.tables import outbox, tool_calls

__all__ = [
    "FINAL",
    "RunInput",
    "answer_run",
    "approve_run",
    "cancel_run",
    "expire_ask",
    "submit_run",
]

FINAL = frozenset({"completed", "failed", "cancelled"})
CANCELLED_TEXT = "Cancelled: the run was cancelled before this call finished."
DECLINED_TEXT = "Declined by user"
T = TypeVar("T")


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


def _input_messages(value: str | list[dict[str, Any]]) -> list[Message]:
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
            raise SpecError(f"webhook.events: unknown event types {', '.join(unknown)}; "
                            f"one of {', '.join(sorted(DURABLE_EVENTS))} or '*'")
        return req.webhook.model_dump()
    url = rt.settings.webhook_url
    if url and req.tenant == "default" and req.parent_run_id is None:
        return {"url": url, "events": None, "secret_env": rt.settings.webhook_secret_env}
    return None


def submit_run(rt: Runtime, req: RunInput) -> tuple[RowMapping, bool]:
    """Create a queued run and its first round message; an Idempotency-Key replay returns the
    run it created the first time (``created`` False)."""
    msgs = _input_messages(req.input)
    build_catalog(req.agent)  # unknown tools, bad inline tools: a clear error now, not mid-run
    check_sources(rt, req.tenant, req.agent, req.inputs)  # the datasets it names exist
    ts = repo.now()
    if req.idempotency_key:
        with rt.engine.connect() as conn:
            found = repo.find_idempotent(conn, req.tenant, req.idempotency_key)
        if found is not None:
            return found, False
    if req.inputs.get("attachments"):  # SPEC M-11: ids must exist; data URLs become files
        refs = resolve_attachments(rt, req.tenant, req.inputs["attachments"])
        req = replace(req, inputs={**req.inputs, "attachments": refs})
    run_id = new_id("run")
    deadline = ts + req.agent.budget.deadline_s if req.agent.budget.deadline_s else None
    row = {
        "id": run_id, "tenant": req.tenant, "kind": req.agent.kind,
        "agent": req.agent.model_dump(mode="json", exclude_none=True), "status": "queued",
        "thread_id": req.thread_id, "idempotency_key": req.idempotency_key,
        "meta": req.metadata, "webhook": webhook_config(rt, req),
        "inputs": req.inputs or None, "deadline_at": deadline,
        "parent_run_id": req.parent_run_id, "parent_call_id": req.parent_call_id,
    }
    try:
        return _guarded(rt, run_id, lambda conn: _create(rt, conn, req, row, msgs, ts)), True
    except IntegrityError:
        if not req.idempotency_key:
            raise
        with rt.engine.connect() as conn:
            found = repo.find_idempotent(conn, req.tenant, req.idempotency_key)
        if found is None:
            raise
        return found, False


def _create(
    rt: Runtime, conn: Connection, req: RunInput, row: dict[str, Any], msgs: list[Message],
    ts: float,
) -> tuple[RowMapping, list[OutboxItem]] | None:
    """Insert the run and queue its first round. On a thread it starts with the thread's
    history, or is held (no round yet) behind the active run. None = lost a race."""
    admitted = _admit(rt, conn, req, row["id"], ts) if req.thread_id else threads.Admission(
        inputs=dict(req.inputs))
    if admitted is None:
        return None
    ts = admitted.stamp or ts
    first = [*admitted.history, *msgs]
    if admitted.held:
        held_inputs = {**req.inputs, threads.QUEUED_INPUT: [m.to_dict() for m in msgs]}
        row, first = {**row, "held": True, "inputs": held_inputs}, []
    else:
        row = {**row, "inputs": admitted.inputs or None}
    repo.insert_run(conn, row, first, ts)
    changes = repo.Changes(bump_version=False)
    changes.event("run.queued", kind=req.agent.kind, **({"held": True} if admitted.held else {}))
    if not admitted.held:
        changes.outbox.append(("round", {}))
    applied = repo.apply(conn, row["id"], 0, changes, redrive_after=rt.settings.redrive_seconds,
                         ts=ts)
    assert applied is not None
    return applied.row, [*admitted.items, *applied.outbox_ids]


def _admit(
    rt: Runtime, conn: Connection, req: RunInput, run_id: str, ts: float
) -> threads.Admission | None:
    """One active run per thread; on a busy thread the thread's ``multitask`` policy decides:
    reject (409), enqueue (held until the active run ends) or interrupt (cancel it, start)."""
    assert req.thread_id is not None
    thread = threads.lock(conn, req.thread_id, ts, req.tenant)  # first: lock order
    assert thread is not None
    stamp = float(thread["updated_at"])  # grows with each lock: the thread's run order
    active = thread_store.active_run(conn, req.thread_id)
    items: list[OutboxItem] = []
    if active is not None or thread_store.next_held(conn, req.thread_id) is not None:
        policy = thread["multitask"]
        if policy == "reject":
            busy = f"run {active['id']}" if active is not None else "queued runs"
            raise Conflict(f"thread {req.thread_id} is busy with {busy}")
        if policy == "enqueue" or active is None:
            return threads.Admission(held=True, stamp=stamp)
        applied = _cancel(rt, conn, active, ts, release=False, interrupted_by=run_id)
        if applied is None:
            return None
        items = applied.outbox_ids
    return threads.Admission(
        stamp=stamp,
        history=threads.history(conn, req.thread_id),
        inputs=threads.start_inputs(conn, req.thread_id, req.agent.kind, req.inputs),
        items=items,
    )


class _LostRace(Exception):
    """Roll the transaction back: what ``op`` wrote before losing must not stay."""


def _guarded(
    rt: Runtime, run_id: str, op: Callable[[Connection], tuple[T, list[OutboxItem]] | None]
) -> T:
    """Run ``op`` in a transaction; ``None`` = lost a version race: roll back, read again and
    retry. After the commit: publish, and wake the run's SSE tails."""
    for _ in range(20):
        try:
            with rt.engine.begin() as conn:
                out = op(conn)
                if out is None:
                    raise _LostRace
        except _LostRace:
            continue
        assert out is not None
        value, items = out
        rt.publish(items)
        rt.wake(run_id)
        return value
    raise Conflict("the run kept changing; try again")


def _load(conn: Connection, tenant: str | None, run_id: str) -> RowMapping:
    run = repo.get_run(conn, run_id, tenant)
    if run is None:
        raise NotFound(f"run {run_id} not found")
    return run


def cancel_run(rt: Runtime, tenant: str, run_id: str) -> RowMapping:
    def op(conn: Connection) -> tuple[RowMapping, list[OutboxItem]] | None:
        run = _load(conn, tenant, run_id)
        if run["status"] in FINAL:
            raise Conflict(f"run {run_id} is already {run['status']}")
        ts = repo.now()
        threads.lock(conn, run["thread_id"], ts)  # lock order: the thread, then the run's rows
        applied = _cancel(rt, conn, run, ts)
        if applied is None:
            return None
        return applied.row, applied.outbox_ids  # webhooks, and a released run of the thread

    return _guarded(rt, run_id, op)


def _cancel(
    rt: Runtime, conn: Connection, run: RowMapping, ts: float, *, release: bool = True,
    **event: Any,
) -> repo.Applied | None:
    """Cancel a non-final run: every dangling tool call gets a tool message, its queued work
    is dropped, its active children are cancelled too (same transaction). On a thread
    (``release``) the thread's next held run starts. A child's parent sees it end (its call
    gets the cancellation as result). None = lost a race (or it ended meanwhile)."""
    if run["parent_run_id"] is not None:  # lock order: the ancestors, then the run's rows
        children.lock_lineage(conn, run["id"], ts=ts, ending=True)
    changes = repair_changes(conn, run, CANCELLED_TEXT)
    changes.values.update(status="cancelled", stop_reason="cancelled", pending=None,
                          after_join=None, open_calls=0, lease_until=None,
                          lease_owner=None, wake_at=None)
    changes.event("run.cancelled", **event)
    applied = threads.apply_final(conn, run["id"], run["version"], changes,
                                  thread_id=run["thread_id"] if release else None,
                                  redrive_after=rt.settings.redrive_seconds, ts=ts)
    if applied is None:
        return None
    conn.execute(sa.delete(outbox).where(outbox.c.run_id == run["id"],
                                          outbox.c.kind.in_(("round", "tool"))))
    items = list(applied.outbox_ids)
    for child in children.active_children(conn, run["id"]):
        cancelled = _cancel(rt, conn, child, ts, cascaded_from=run["id"])
        if cancelled is None:
            return None
        items += cancelled.outbox_ids
    return replace(applied, outbox_ids=items)


def repair_changes(conn: Connection, run: RowMapping, text: str) -> repo.Changes:
    """Every tool call the model made gets a tool message (no dangling call survives)."""
    run_id = run["id"]
    open_ids = [c["call_id"] for c in repo.list_tool_calls(conn, run_id) if c["status"] != "done"]
    if open_ids:
        conn.execute(
            sa.update(tool_calls)
            .where(tool_calls.c.run_id == run_id, tool_calls.c.call_id.in_(open_ids))
            .values(status="done", result=text, result_for_model=text, finished_at=repo.now())
        )
    changes = repo.Changes()
    calls = repo.list_tool_calls(conn, run_id)
    msgs, flushed = flush_calls(calls)
    _mark_flushed(conn, run_id, flushed)
    for m in msgs:
        changes.message(m, run["round"])
    return changes


def _mark_flushed(conn: Connection, run_id: str, ids: Sequence[str]) -> None:
    if ids:
        conn.execute(sa.update(tool_calls)
                     .where(tool_calls.c.run_id == run_id, tool_calls.c.call_id.in_(ids))
                     .values(flushed=True))


def _call_row(conn: Connection, run_id: str, call_id: str) -> RowMapping | None:
    return conn.execute(
        sa.select(tool_calls).where(tool_calls.c.run_id == run_id, tool_calls.c.call_id == call_id)
    ).mappings().first()


def _resume_changes(conn: Connection, run: RowMapping, round_: int) -> repo.Changes:
    """Flush the batch's finished calls in order and queue the next round."""
    changes = repo.Changes()
    msgs, flushed = flush_calls(repo.list_tool_calls(conn, run["id"], round_))
    _mark_flushed(conn, run["id"], flushed)
    for m in msgs:
        changes.message(m, round_)
    settle(changes, Continue(), run_id=run["id"], round_=round_, ts=repo.now())
    changes.event("run.resumed")
    return changes


def _load_for(
    conn: Connection, tenant: str | None, run_id: str, token: str | None, kind: str,
    pause_id: str,
) -> RowMapping:
    """Load the run; with a resume token, spend it first (401/409, see shared.engine.resume).
    ``tenant`` None: any tenant's run (the token, not an API key, names the run)."""
    if token is None:
        return _load(conn, tenant, run_id)
    spend_resume_token(conn, token, run_id=run_id, kind=kind, pause_id=pause_id, ts=repo.now())
    run = _load(conn, tenant, run_id)
    if not pause_is_current(run["pending"], run["status"], kind, pause_id):
        raise Conflict(f"run {run_id} is no longer waiting on {kind} {pause_id}")
    return run


def answer_run(
    rt: Runtime, tenant: str | None, run_id: str, ask_id: str, answers: list[str],
    token: str | None = None,
) -> RowMapping:
    """SPEC A-3: the answer becomes the ask's tool message; the next round is queued.
    ``token``: a resume token instead of an API key (single use, this ask only)."""

    def op(conn: Connection) -> tuple[RowMapping, list[OutboxItem]] | None:
        run = _load_for(conn, tenant, run_id, token, "ask", ask_id)
        pending = run["pending"] or {}
        if run["status"] != "waiting" or pending.get("kind") != "ask":
            return _already_answered(conn, run, ask_id, answers)
        if pending.get("ask_id") != ask_id:
            raise Conflict(f"run {run_id} is waiting on ask {pending.get('ask_id')}, not {ask_id}")
        owner = _pause_owner(conn, run, "ask_id")
        if owner is None:
            return None
        text = ask_mod.render_answer(ask_mod.Ask.from_dict(owner["pending"]), answers)
        out = _finish_ask(rt, conn, owner, ask_id, text, {"answers": answers})
        return None if out is None else _as_addressed(conn, run, out)

    return _guarded(rt, run_id, op)


def _pause_owner(conn: Connection, run: RowMapping, key: str) -> RowMapping | None:
    """The run that owns the pause ``run`` shows: itself, or the descendant whose ask or
    approval it surfaces (``pending.run_id``); None = that run moved on (read again)."""
    target_id = (run["pending"] or {}).get("run_id")
    if not target_id:
        return run
    target = repo.get_run(conn, target_id, run["tenant"])
    if target is None or target["status"] != "waiting" or \
            (target["pending"] or {}).get(key) != run["pending"].get(key):
        return None
    return target


def _as_addressed(
    conn: Connection, run: RowMapping, out: tuple[RowMapping, list[OutboxItem]]
) -> tuple[RowMapping, list[OutboxItem]]:
    """A pause answered through an ancestor: the API shows the run it was sent to."""
    if out[0]["id"] == run["id"]:
        return out
    row = repo.get_run(conn, run["id"])
    assert row is not None
    return row, out[1]


def _already_answered(
    conn: Connection, run: RowMapping, ask_id: str, answers: list[str]
) -> tuple[RowMapping, list[OutboxItem]]:
    call = _call_row(conn, run["id"], ask_id) or _descendant_call(conn, run["id"], ask_id)
    answered = call is not None and call["status"] == "done"
    if answered and (call["data"] or {}).get("answers") == answers:  # type: ignore[index]
        return run, []  # the same answer again: idempotent
    raise Conflict(f"run {run['id']} is {run['status']}, not waiting on ask {ask_id}")


def _finish_ask(
    rt: Runtime, conn: Connection, run: RowMapping, ask_id: str, text: str, data: dict[str, Any]
) -> tuple[RowMapping, list[OutboxItem]] | None:
    _lock_ancestors(conn, run)
    call = _call_row(conn, run["id"], ask_id)
    if call is None:
        raise Conflict(f"ask {ask_id} has no tool call")
    conn.execute(
        sa.update(tool_calls)
        .where(tool_calls.c.run_id == run["id"], tool_calls.c.call_id == ask_id)
        .values(status="done", result=text, result_for_model=text, data=data,
                finished_at=repo.now())
    )
    changes = _resume_changes(conn, run, call["round"])
    applied = repo.apply(conn, run["id"], run["version"], changes,
                         redrive_after=rt.settings.redrive_seconds)
    if applied is None:
        return None
    return applied.row, [*applied.outbox_ids, *_resync_parent(rt, conn, applied.row)]


def _lock_ancestors(conn: Connection, run: RowMapping) -> None:
    """A child's resume changes its ancestors: lock them before any row of the child."""
    if run["parent_run_id"] is not None:
        children.lock_lineage(conn, run["id"], ts=repo.now(), ending=False)


def _resync_parent(rt: Runtime, conn: Connection, run: RowMapping) -> list[OutboxItem]:
    """A child resumed: its parent (and theirs) run again, or show the next paused child."""
    if run["parent_run_id"] is None:
        return []
    return children.sync_parent(conn, run, redrive_after=rt.settings.redrive_seconds,
                                ts=repo.now())


def _descendant_call(conn: Connection, run_id: str, call_id: str) -> RowMapping | None:
    """A call of a run below ``run_id`` (a pause answered through an ancestor)."""
    ids = children.descendant_ids(conn, run_id)
    if not ids:
        return None
    return conn.execute(
        sa.select(tool_calls).where(tool_calls.c.run_id.in_(ids), tool_calls.c.call_id == call_id)
    ).mappings().first()


def expire_ask(rt: Runtime, run_id: str) -> None:
    """SPEC A-4: an expired ask is answered ``(no answer: timed out)`` or fails the run."""

    def op(conn: Connection) -> tuple[None, list[OutboxItem]] | None:
        run = repo.get_run(conn, run_id)
        if run is None or run["status"] != "waiting" or (run["pending"] or {}).get("kind") != "ask":
            return None, []
        spec = AgentSpec.model_validate(run["agent"])
        if spec.ask_timeout_action == "fail":
            threads.lock(conn, run["thread_id"], repo.now())  # lock order: the thread first
            if run["parent_run_id"] is not None:  # then the ancestors
                children.lock_lineage(conn, run_id, ts=repo.now(), ending=True)
            changes = repair_changes(conn, run, ask_mod.TIMEOUT_TEXT)
            settle(changes, Fail(reason="the ask expired without an answer", code="ask_timeout"),
                   run_id=run_id, round_=run["round"], ts=repo.now())
            applied = threads.apply_final(conn, run_id, run["version"], changes,
                                          thread_id=run["thread_id"],
                                          redrive_after=rt.settings.redrive_seconds)
            return (None, applied.outbox_ids) if applied else None
        out = _finish_ask(rt, conn, run, run["pending"]["ask_id"], ask_mod.TIMEOUT_TEXT,
                          {"timed_out": True})
        return None if out is None else (None, out[1])

    _guarded(rt, run_id, op)


def approve_run(
    rt: Runtime, tenant: str | None, run_id: str, approval_id: str,
    approve: list[str] | str, reject: list[str] | None = None, note: str | None = None,
    token: str | None = None,
) -> RowMapping:
    """SPEC N-4: approved writes run (fan-out); rejected ones get ``Declined by user``; then
    a separate summary round. ``token``: a resume token for this approval."""

    def op(conn: Connection) -> tuple[RowMapping, list[OutboxItem]] | None:
        run = _load_for(conn, tenant, run_id, token, "approval", approval_id)
        pending = run["pending"] or {}
        if run["status"] != "waiting" or pending.get("kind") != "approval":
            return _already_approved(conn, run, approval_id)
        if pending.get("approval_id") != approval_id:
            raise Conflict(f"run {run_id} is waiting on approval {pending.get('approval_id')}")
        owner = _pause_owner(conn, run, "approval_id")
        if owner is None:
            return None
        ids = [i["call_id"] for i in owner["pending"]["items"]]
        approved = _approved_ids(ids, approve, reject)
        out = _apply_approval(rt, conn, owner, ids, approved, approval_id, note)
        return None if out is None else _as_addressed(conn, run, out)

    return _guarded(rt, run_id, op)


def _approved_ids(ids: list[str], approve: list[str] | str, reject: list[str] | None) -> list[str]:
    chosen = ids if approve == "all" else list(approve)
    unknown = sorted((set(chosen) | set(reject or [])) - set(ids))
    if unknown:
        raise SpecError(f"unknown call ids in the approval: {', '.join(unknown)}")
    both = set(chosen) & set(reject or [])
    if both:
        raise SpecError(f"call ids both approved and rejected: {', '.join(sorted(both))}")
    return [i for i in ids if i in chosen]


def _already_approved(
    conn: Connection, run: RowMapping, approval_id: str
) -> tuple[RowMapping, list[OutboxItem]]:
    """The same approval again is idempotent: some call of the run (or, for an approval
    answered through it, of a descendant) carries its id."""
    ids = [run["id"], *children.descendant_ids(conn, run["id"])]
    datas = conn.execute(
        sa.select(tool_calls.c.data).where(tool_calls.c.run_id.in_(ids))
    ).scalars()
    if any((d or {}).get("approval_id") == approval_id for d in datas):
        return run, []
    raise Conflict(f"run {run['id']} is {run['status']}, not waiting on approval {approval_id}")


def _apply_approval(
    rt: Runtime, conn: Connection, run: RowMapping, ids: list[str], approved: list[str],
    approval_id: str, note: str | None,
) -> tuple[RowMapping, list[OutboxItem]] | None:
    run_id, ts = run["id"], repo.now()
    _lock_ancestors(conn, run)
    rejected = [i for i in ids if i not in approved]
    spec = AgentSpec.model_validate(run["agent"])
    window = set(approved[: spec.effective_parallel_tools])
    for cid in ids:
        values: dict[str, Any] = {"data": {"approval_id": approval_id, "approved": cid in approved}}
        if cid in rejected:
            values.update(status="done", result=DECLINED_TEXT, result_for_model=DECLINED_TEXT,
                          finished_at=ts)
        else:
            values.update(status="queued" if cid in window else "pending")
        conn.execute(sa.update(tool_calls)
                     .where(tool_calls.c.run_id == run_id, tool_calls.c.call_id == cid)
                     .values(**values))
    round_ = _call_row(conn, run_id, ids[0])["round"]  # type: ignore[index]
    if not approved:
        changes = _resume_changes(conn, run, round_)
    else:
        changes = repo.Changes()
        changes.values.update(status="running", pending=None, open_calls=len(approved),
                              after_join={"type": "continue"})
        changes.event("run.resumed", approved=approved, rejected=rejected, note=note)
        for cid in approved:
            if cid in window:
                changes.outbox.append(("tool", {"call_id": cid}))
    applied = repo.apply(conn, run_id, run["version"], changes,
                         redrive_after=rt.settings.redrive_seconds, ts=ts)
    if applied is None:
        return None
    return applied.row, [*applied.outbox_ids, *_resync_parent(rt, conn, applied.row)]
