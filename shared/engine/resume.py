"""Resume tokens: a per-pause credential, delivered only in the ``run.waiting``
webhook, that lets a third party answer that one ask (or decide that one approval) without an
API key.

A token is single-purpose: it names one run, one kind (``ask`` → /answer, ``approval`` →
/approval) and one pause id. It is spent in the transaction that resumes the run, and it
expires with the pause (answered, expired, cancelled) or at the ask's ``expires_at``.

401: the token does not authorize this request (unknown, other run, other kind, other pause,
past its expiry). 409: the token was right but its pause is over (already used, or the run is
no longer waiting on it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy.engine import Connection

from shared.errors import Conflict, Unauthorized
from shared.store import deliveries
from shared.vocab import Status

__all__ = ["pause_is_current", "spend_resume_token"]


def spend_resume_token(
    conn: Connection, token: str, *, run_id: str, kind: str, pause_id: str, ts: float
) -> None:
    """Check ``token`` for this exact request and spend it, in the caller's transaction (which
    must roll back if the resume does not happen)."""
    row = deliveries.get_token(conn, token)
    if row is None or row["run_id"] != run_id or row["kind"] != kind:
        raise Unauthorized("invalid resume token for this run and action")
    if row["pause_id"] != pause_id:
        raise Unauthorized(f"this resume token is for {kind} {row['pause_id']}, not {pause_id}")
    if row["used_at"] is not None:
        raise Conflict("this resume token was already used")
    if row["expires_at"] is not None and ts >= row["expires_at"]:
        raise Unauthorized("this resume token has expired")
    if not deliveries.use_token(conn, token, ts):
        raise Conflict("this resume token was already used")


def pause_is_current(
    pending: Mapping[str, Any] | None, status: str, kind: str, pause_id: str
) -> bool:
    """Is the run still waiting on this very pause?"""
    p = pending or {}
    key = "ask_id" if kind == "ask" else "approval_id"
    return status == Status.WAITING and p.get("kind") == kind and p.get(key) == pause_id
