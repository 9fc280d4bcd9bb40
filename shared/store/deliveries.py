"""Webhook deliveries and resume tokens, inside the caller's transaction.

A durable event that the run's webhook wants becomes a ``webhook_deliveries`` row (the exact
body that is signed and sent, a stable ``webhook-id``) and an outbox row of kind ``webhook``,
in the same transaction that wrote the event: a crash never loses a callback, and a retry
sends the same ``webhook-id`` so receivers can deduplicate.

A ``run.waiting`` delivery carries a resume token for that pause. The token is never stored:
the delivery's body holds ``REDACTED_TOKEN`` in its place, and each try mints a fresh token
(``with_fresh_tokens``, only its SHA-256 stored in ``resume_tokens``) that exists only in the
request sent. Every token of a pause resumes that pause once, and all expire with it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Connection, RowMapping

from shared.isotime import epoch, iso, iso_times
from shared.store.tables import outbox, resume_tokens, webhook_attempts, webhook_deliveries
from shared.vocab import MEMORY_EVENTS, DeliveryStatus, EventType

__all__ = [
    "DEFAULT_EVENTS",
    "DURABLE_EVENTS",
    "REDACTED_TOKEN",
    "TOKEN_PREFIX",
    "Attempt",
    "Renderer",
    "claim_delivery",
    "finish_attempt",
    "get_delivery",
    "get_token",
    "hash_token",
    "issue_token",
    "list_deliveries",
    "record_webhooks",
    "use_token",
    "wants",
    "with_fresh_tokens",
]

DURABLE_EVENTS = frozenset(
    {
        EventType.RUN_QUEUED,
        EventType.ROUND_STARTED,
        EventType.TOOL_STARTED,
        EventType.TOOL_FINISHED,
        EventType.PLAN_UPDATED,
        EventType.RUN_WAITING,
        EventType.RUN_SUSPENDED,
        EventType.RUN_RESUMED,
        "provider.waiting",
        "provider.retrying",
        EventType.MESSAGE_ADDED,
        EventType.RUN_COMPLETED,
        EventType.RUN_FAILED,
        EventType.RUN_CANCELLED,
        EventType.RUN_RELEASED,
        *(e.value for e in MEMORY_EVENTS),
        EventType.TOOL_UNAVAILABLE.value,
        EventType.CONTEXT_UNCOMPRESSED.value,  # docs/loop.md L-8
        EventType.GUARDRAIL_TRIPPED.value,  # docs/guardrails.md
        EventType.RUN_HANDOFF.value,  # docs/handoffs.md
    }
)
DEFAULT_EVENTS = frozenset(
    {EventType.RUN_WAITING, EventType.RUN_COMPLETED, EventType.RUN_FAILED, EventType.RUN_CANCELLED}
)
TOKEN_PREFIX = "rtk_"
REDACTED_TOKEN = TOKEN_PREFIX + "…"  # in stored bodies and views; the real one only on the wire
log = logging.getLogger("treadle.webhook")
OutboxItem = tuple[int, str, dict[str, Any]]
Event = tuple[int, str, Mapping[str, Any]]  # (seq, type, data)
Row = Mapping[Any, Any]  # a RowMapping, or a dict in tests


def wants(cfg: Mapping[str, Any] | None, type_: str) -> bool:
    """Does a run's webhook config (``{url, events?, secret_env?}``) fire on ``type_``?"""
    if not cfg or not cfg.get("url"):
        return False
    events = cfg.get("events") or DEFAULT_EVENTS
    return type_ in events or ("*" in events and type_ in DURABLE_EVENTS)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def record_webhooks(
    conn: Connection,
    run: Row,
    events: Sequence[Event],
    ts: float,
    redrive_after: float,
    renderers: Mapping[str, Renderer],
) -> list[OutboxItem]:
    """Queue a delivery for each event the run's webhook wants; returns outbox items.
    ``renderers``: the facades' body renderers a webhook may name (handed in by the runtime,
    so the store never imports the code that renders)."""
    cfg = run.get("webhook")
    if not cfg:
        return []
    items = (
        _enqueue(conn, run, cfg, ev, ts, redrive_after, renderers)
        for ev in events
        if wants(cfg, ev[1])
    )
    return [item for item in items if item is not None]


class Renderer(Protocol):
    """Reshapes a delivery's body for a facade (``doc``: treadle's body), or returns None:
    this event sends nothing. Runs inside the commit transaction: it only reads."""

    def __call__(
        self, conn: Connection, run: Row, event: Event, doc: dict[str, Any]
    ) -> dict[str, Any] | None: ...


def _renderer_name(value: object) -> str:
    """``render`` is a renderer's name (``langgraph``); runs recorded before names were used
    hold ``module:<name>_body``, which names the same renderer."""
    return str(value).rpartition(":")[2].removesuffix("_body")


def _render(
    conn: Connection,
    run: Row,
    cfg: Mapping[str, Any],
    event: Event,
    doc: dict[str, Any],
    renderers: Mapping[str, Renderer],
) -> dict[str, Any] | None:
    """A facade's body: ``cfg["render"]`` names an installed ``Renderer``. A missing or
    failing renderer never fails the commit: the treadle body is sent instead."""
    if not cfg.get("render"):
        return doc
    name = _renderer_name(cfg["render"])
    renderer = renderers.get(name)
    if renderer is None:
        log.warning("webhook renderer %r is not installed; sending the treadle body", name)
        return doc
    try:
        return renderer(conn, run, event, doc)
    except Exception:
        log.warning("webhook renderer %s failed; sending the treadle body", name, exc_info=True)
        return doc


def _enqueue(
    conn: Connection,
    run: Row,
    cfg: Mapping[str, Any],
    event: Event,
    ts: float,
    redrive_after: float,
    renderers: Mapping[str, Renderer],
) -> OutboxItem | None:
    seq, type_, data = event
    delivery_id = f"msg_{uuid.uuid4().hex}"
    payload: dict[str, Any] = {
        "run_id": run["id"],
        "seq": seq,
        "status": run["status"],
        **iso_times(data),
    }
    if run.get("meta"):
        payload["metadata"] = run["meta"]
    if type_ == EventType.RUN_WAITING:
        resume = _resume_of(run["id"], data.get("pending") or {})
        if resume is not None:
            payload["resume"] = iso_times(resume)
    envelope = {"type": type_, "timestamp": iso(ts), "data": payload}
    doc = _render(conn, run, cfg, event, envelope, renderers)
    if doc is None:
        return None
    body = json.dumps(doc, ensure_ascii=False)
    conn.execute(
        sa.insert(webhook_deliveries).values(
            id=delivery_id,
            run_id=run["id"],
            tenant=run["tenant"],
            event_seq=seq,
            event_type=type_,
            url=cfg["url"],
            secret_env=cfg.get("secret_env"),
            body=body,
            status=DeliveryStatus.PENDING,
            next_attempt_at=ts,
            created_at=ts,
            updated_at=ts,
        )
    )
    msg = {"run_id": run["id"], "version": run["version"], "delivery_id": delivery_id}
    outbox_id = conn.execute(
        sa.insert(outbox)
        .values(
            run_id=run["id"],
            kind="webhook",
            payload=msg,
            available_at=ts + redrive_after,
            created_at=ts,
        )
        .returning(outbox.c.id)
    ).scalar_one()
    return int(outbox_id), "webhook", msg


def _resume_of(run_id: str, pending: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``resume`` block of a waiting run's webhook, its token redacted (see the doc)."""
    kind = pending.get("kind")
    pause_id = pending.get("ask_id") if kind == "ask" else pending.get("approval_id")
    if kind not in ("ask", "approval") or not pause_id:
        return None
    return {
        "token": REDACTED_TOKEN,
        "kind": kind,
        "pause_id": pause_id,
        "expires_at": pending.get("expires_at"),
        "path": f"/v1/runs/{run_id}/{'answer' if kind == 'ask' else 'approval'}",
    }


def _mint_token(conn: Connection, run_id: str, resume: Mapping[str, Any], ts: float) -> str:
    expires = resume.get("expires_at")  # ISO 8601 in the body (the API's one time format)
    at = epoch(expires) if isinstance(expires, str) else expires
    return issue_token(conn, run_id, str(resume["kind"]), str(resume["pause_id"]), at, ts)


def issue_token(
    conn: Connection, run_id: str, kind: str, pause_id: str, expires_at: float | None, ts: float
) -> str:
    """A new resume token for this pause (only its hash is stored): a webhook's, or one
    handed to a caller that cannot be asked in its own protocol (an MCP client without
    elicitation)."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    conn.execute(
        sa.insert(resume_tokens).values(
            token_hash=hash_token(token),
            run_id=run_id,
            kind=kind,
            pause_id=pause_id[:200],
            expires_at=expires_at,
            created_at=ts,
        )
    )
    return token


def _resume_blocks(doc: Any) -> list[dict[str, Any]]:
    """The ``resume`` blocks anywhere in a body (a facade may move it), iteratively."""
    found, stack = [], [doc]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            if value.get("token") == REDACTED_TOKEN and value.get("kind") in ("ask", "approval"):
                found.append(value)
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return found


def with_fresh_tokens(conn: Connection, delivery: Row, ts: float) -> str:
    """The body to send on this try: each redacted resume token replaced by a new one, whose
    hash is stored in the caller's transaction. A body without one is returned as it is."""
    body = str(delivery["body"])
    if REDACTED_TOKEN not in body:
        return body
    doc = json.loads(body)
    for block in _resume_blocks(doc):
        block["token"] = _mint_token(conn, str(delivery["run_id"]), block, ts)
    return json.dumps(doc, ensure_ascii=False)


# --- the sender's side --------------------------------------------------------------------


def claim_delivery(
    conn: Connection, delivery_id: str, ts: float, lease: float
) -> RowMapping | None:
    """Take a delivery that is due (or whose sender's lease ran out); counts the attempt."""
    d = webhook_deliveries.c
    stmt = (
        sa.update(webhook_deliveries)
        .where(
            d.id == delivery_id,
            sa.or_(
                sa.and_(d.status == DeliveryStatus.PENDING, d.next_attempt_at <= ts + 1.0),
                sa.and_(d.status == DeliveryStatus.SENDING, d.lease_until < ts),
            ),
        )
        .values(
            status=DeliveryStatus.SENDING,
            attempts=d.attempts + 1,
            lease_until=ts + lease,
            updated_at=ts,
        )
        .returning(*webhook_deliveries.c)
    )
    return conn.execute(stmt).mappings().first()


@dataclass(frozen=True)
class Attempt:
    """What one HTTP try did."""

    started_at: float
    duration_ms: int
    status_code: int | None = None
    error: str | None = None
    response: str | None = None
    final: bool = False  # a failure that would recur: not retried (a refused redirect)

    @property
    def ok(self) -> bool:
        return self.error is None and self.status_code is not None and 200 <= self.status_code < 300


def finish_attempt(
    conn: Connection,
    delivery: Row,
    attempt: Attempt,
    next_at: float | None,
    outbox_id: int | None,
    ts: float,
) -> str:
    """Log the try; then delivered, failed (no ``next_at``), or pending until ``next_at`` (the
    outbox row waits until then, and the reaper re-sends it). Returns the new status."""
    conn.execute(
        sa.insert(webhook_attempts).values(
            delivery_id=delivery["id"],
            attempt=delivery["attempts"],
            started_at=attempt.started_at,
            duration_ms=attempt.duration_ms,
            status_code=attempt.status_code,
            error=attempt.error,
            response=(attempt.response or "")[:500] or None,
        )
    )
    status = (
        DeliveryStatus.DELIVERED
        if attempt.ok
        else (DeliveryStatus.PENDING if next_at is not None else DeliveryStatus.FAILED)
    )
    d = webhook_deliveries.c
    conn.execute(
        sa.update(webhook_deliveries)
        .where(
            d.id == delivery["id"],
            d.status == DeliveryStatus.SENDING,
            d.attempts == delivery["attempts"],
        )
        .values(
            status=status,
            lease_until=None,
            updated_at=ts,
            next_attempt_at=next_at,
            last_status_code=attempt.status_code,
            last_error=attempt.error,
            delivered_at=ts if attempt.ok else None,
        )
    )
    if outbox_id is not None:
        if status == DeliveryStatus.PENDING:
            assert next_at is not None
            conn.execute(
                sa.update(outbox).where(outbox.c.id == outbox_id).values(available_at=next_at)
            )
        else:
            conn.execute(sa.delete(outbox).where(outbox.c.id == outbox_id))
    return status


def get_delivery(conn: Connection, delivery_id: str) -> RowMapping | None:
    q = sa.select(webhook_deliveries).where(webhook_deliveries.c.id == delivery_id)
    return conn.execute(q).mappings().first()


def list_deliveries(conn: Connection, run_id: str) -> list[dict[str, Any]]:
    """The run's deliveries in event order, each with its attempts (oldest first)."""
    rows = (
        conn.execute(
            sa.select(webhook_deliveries)
            .where(webhook_deliveries.c.run_id == run_id)
            .order_by(webhook_deliveries.c.event_seq)
        )
        .mappings()
        .all()
    )
    ids = [r["id"] for r in rows]
    attempts: dict[str, list[dict[str, Any]]] = {i: [] for i in ids}
    if ids:
        for a in conn.execute(
            sa.select(webhook_attempts)
            .where(webhook_attempts.c.delivery_id.in_(ids))
            .order_by(webhook_attempts.c.id)
        ).mappings():
            attempts[a["delivery_id"]].append(dict(a))
    return [{**dict(r), "attempt_log": attempts[r["id"]]} for r in rows]


# --- resume tokens --------------------------------------------------------------------------


def get_token(conn: Connection, token: str) -> RowMapping | None:
    q = sa.select(resume_tokens).where(resume_tokens.c.token_hash == hash_token(token))
    return conn.execute(q).mappings().first()


def use_token(conn: Connection, token: str, ts: float) -> bool:
    """Spend the token (once): False when it was already used."""
    t = resume_tokens.c
    stmt = (
        sa.update(resume_tokens)
        .where(t.token_hash == hash_token(token), t.used_at.is_(None))
        .values(used_at=ts)
    )
    return conn.execute(stmt).rowcount == 1
