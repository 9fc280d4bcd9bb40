"""Views for webhooks and resume tokens on the HTTP API."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from shared.isotime import iso
from shared.store.deliveries import TOKEN_PREFIX
from shared.vocab import DeliveryStatus

__all__ = ["DeliveryList", "DeliveryView", "delivery_view", "resume_token"]


class AttemptView(BaseModel):
    attempt: int
    at: str
    duration_ms: int
    status_code: int | None
    error: str | None
    response: str | None


class DeliveryView(BaseModel):
    webhook_id: str
    event_seq: int
    event_type: str
    url: str
    status: str
    attempts: int
    next_attempt_at: str | None
    last_status_code: int | None
    last_error: str | None
    created_at: str
    delivered_at: str | None
    payload: Any
    attempt_log: list[AttemptView]


class DeliveryList(BaseModel):
    deliveries: list[DeliveryView]


def resume_token(authorization: str | None, x_resume_token: str | None) -> str | None:
    """The resume token of a request: ``X-Resume-Token``, or ``Authorization: Bearer rtk_...``.
    Any other bearer credential is left to API-key authentication."""
    if x_resume_token and x_resume_token.strip():
        return x_resume_token.strip()
    if authorization:
        scheme, _, cred = authorization.partition(" ")
        if scheme.lower() == "bearer" and cred.strip().startswith(TOKEN_PREFIX):
            return cred.strip()
    return None


def _redacted(body: str) -> Any:
    """The payload as sent, but for the resume token, which is never stored."""
    return json.loads(body)


def _when(ts: float | None) -> str | None:
    return iso(ts) if ts is not None else None


def delivery_view(d: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "webhook_id": d["id"],
        "event_seq": d["event_seq"],
        "event_type": d["event_type"],
        "url": d["url"],
        "status": d["status"],
        "attempts": d["attempts"],
        "next_attempt_at": _when(d["next_attempt_at"])
        if d["status"] == DeliveryStatus.PENDING
        else None,
        "last_status_code": d["last_status_code"],
        "last_error": d["last_error"],
        "created_at": iso(d["created_at"]),
        "delivered_at": _when(d["delivered_at"]),
        "payload": _redacted(d["body"]),
        "attempt_log": [
            {
                "attempt": a["attempt"],
                "at": iso(a["started_at"]),
                "duration_ms": a["duration_ms"],
                "status_code": a["status_code"],
                "error": a["error"],
                "response": a["response"],
            }
            for a in d["attempt_log"]
        ],
    }
