"""Outbound webhooks: sign one delivery (Standard Webhooks), POST it, log the try,
schedule the next.

One ``deliver`` call is one HTTP try, claimed first so two copies of the message never send at
once. Every try of a delivery carries the same ``webhook-id`` (receivers deduplicate on it) and
a fresh ``webhook-timestamp`` and ``webhook-signature`` — and, for a waiting run, a fresh
resume token minted for that try (the stored body holds none). A failed try leaves the outbox row in
place, due at the next try: 5 s, 15 s, 45 s, ... (x3, at most 4 h apart, with jitter), for 24 h;
the reaper re-sends it when due, so no Celery countdown comes near the visibility timeout.

The POST goes through the SSRF guard (``shared.tools.netguard``): a run's webhook may not
reach private addresses unless allow-listed (``TREADLE_ALLOW_HOSTS``); the operator's default
webhook host (``TREADLE_WEBHOOK_URL``) is allowed. Each redirect hop is checked before it is
followed: a redirect to a refused address is never followed, and the delivery fails at once
(the same try would be refused again; no retries). Deliveries run on their own queue
(``treadle.webhooks``), never inside a round: a slow or dead receiver does not slow a run.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import os
import random
import time
from datetime import UTC, datetime

import httpx
from sqlalchemy.engine import Connection
from standardwebhooks import Webhook

from shared.config import Settings
from shared.engine.runtime import Runtime
from shared.errors import BlockedAddress, ToolError
from shared.store import deliveries
from shared.store import outbox as outbox_store
from shared.store import runs as run_store
from shared.store.deliveries import Attempt, Row
from shared.tools.netguard import safe_request
from shared.vocab import DELIVERY_SETTLED, DeliveryStatus

__all__ = [
    "MAX_GAP",
    "TENANT_SECRET",
    "deliver",
    "next_attempt_at",
    "send",
    "sign_headers",
    "tenant_secret",
]

log = logging.getLogger("treadle.webhook")
MAX_GAP = 4 * 3600.0  # longest wait between two tries
USER_AGENT = "treadle-webhooks/1"
# a delivery's secret_env "tenant:NAME": sign with the tenant's secret derived from env NAME
# (a submitted spec cannot name it: its secret_env must be a plain variable name)
TENANT_SECRET = "tenant:"


def deliver(rt: Runtime, delivery_id: str, outbox_id: int | None) -> str:
    """One try of one delivery: delivered | pending (retry later) | failed | stale."""
    with rt.engine.begin() as conn:
        lease = rt.settings.webhook_timeout + 30
        d = deliveries.claim_delivery(conn, delivery_id, run_store.now(), lease)
        if d is None:
            _drop_if_settled(conn, delivery_id, outbox_id)
            return "stale"
        body = deliveries.with_fresh_tokens(conn, d, run_store.now())
    attempt = send(d, rt.settings, body)
    ts = run_store.now()
    nxt = next_attempt_at(d, attempt, rt.settings, ts)
    with rt.engine.begin() as conn:
        status = deliveries.finish_attempt(conn, d, attempt, nxt, outbox_id, ts)
    if status != DeliveryStatus.DELIVERED:
        log.info(
            "webhook %s to %s: try %d %s (%s)",
            d["id"],
            d["url"],
            d["attempts"],
            status,
            attempt.error or attempt.status_code,
        )
    return status


def _drop_if_settled(conn: Connection, delivery_id: str, outbox_id: int | None) -> None:
    """A message for a delivery that is over will never be consumed: delete it. (One that is
    not due yet, or held by another sender, keeps its outbox row.)"""
    if outbox_id is None:
        return
    d = deliveries.get_delivery(conn, delivery_id)
    if d is None or d["status"] in DELIVERY_SETTLED:
        outbox_store.delete(conn, outbox_id)


def next_attempt_at(d: Row, attempt: Attempt, settings: Settings, ts: float) -> float | None:
    """When to try again after try number ``d["attempts"]``; None = done (delivered, or out of
    time: ``webhook_retry_for`` after the delivery was created)."""
    if attempt.ok or attempt.final:
        return None
    delay = min(settings.webhook_retry_base * 3 ** max(0, d["attempts"] - 1), MAX_GAP)
    at = ts + delay * random.uniform(0.9, 1.1)
    return at if at <= d["created_at"] + settings.webhook_retry_for else None


def sign_headers(delivery_id: str, ts: float, body: str, secret: str | None) -> dict[str, str]:
    """Standard Webhooks headers; unsigned (no ``webhook-signature``) without a secret."""
    headers = {
        "webhook-id": delivery_id,
        "webhook-timestamp": str(int(ts)),
        "content-type": "application/json",
        "user-agent": USER_AGENT,
    }
    if secret:
        when = datetime.fromtimestamp(int(ts), tz=UTC)
        headers["webhook-signature"] = Webhook(secret).sign(delivery_id, when, body)
    return headers


def tenant_secret(operator_secret: str, tenant: str) -> str:
    """A tenant's own webhook secret, derived from the operator's (``whsec_...``): a facade
    webhook of a tenant is signed with it, so the tenant can check its webhooks without ever
    holding the operator's secret (``treadle keys webhook-secret`` prints it)."""
    key = base64.b64decode(operator_secret.removeprefix("whsec_"))  # Standard Webhooks form
    derived = hmac.new(key, f"treadle-tenant:{tenant}".encode(), hashlib.sha256).digest()
    return "whsec_" + base64.b64encode(derived).decode()


def _secret(d: Row) -> str | None:
    name = str(d["secret_env"] or "")
    if not name:
        return None
    derive = name.startswith(TENANT_SECRET)
    name = name.removeprefix(TENANT_SECRET)
    value = os.environ.get(name)
    if not value:
        raise ToolError(f"webhook secret env {name} is not set on this worker")
    return tenant_secret(value, str(d["tenant"])) if derive else value


def _allow_hosts(settings: Settings) -> list[str]:
    hosts = [h.strip() for h in settings.allow_hosts.split(",") if h.strip()]
    if settings.webhook_url:
        hosts.append(httpx.URL(settings.webhook_url).host)
    return hosts


def send(d: Row, settings: Settings, body: str | None = None) -> Attempt:
    """POST the delivery's body (or ``body``: this try's, with its resume token), signed now.
    Never raises: a failure is the attempt's error."""
    started, t0 = run_store.now(), time.monotonic()
    payload = json.loads(d["body"] if body is None else body)
    # the exact bytes safe_request sends for json=payload: what the signature must cover
    body = json.dumps(payload, ensure_ascii=False)
    try:
        headers = sign_headers(d["id"], started, body, _secret(d))
        resp = safe_request(
            "POST",
            d["url"],
            headers=headers,
            json=payload,
            timeout=settings.webhook_timeout,
            max_bytes=4096,
            allow_hosts=_allow_hosts(settings),
        )
    except BlockedAddress as exc:  # the URL, or a redirect of it: refused again next time
        return Attempt(started, _ms(t0), error=str(exc), final=True)
    except (ToolError, ValueError) as exc:
        return Attempt(started, _ms(t0), error=str(exc) or type(exc).__name__)
    return Attempt(started, _ms(t0), status_code=resp.status_code, response=resp.text[:500])


def _ms(t0: float) -> int:
    return int((time.monotonic() - t0) * 1000)
