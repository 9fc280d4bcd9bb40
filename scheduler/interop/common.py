"""What both facades share: the caller's tenant, SSE framing, the facade webhook spec."""

from __future__ import annotations

import json
from typing import Any

from scheduler import limits
from scheduler.auth import Caller
from shared.agent.spec import AgentSpec, WebhookSpec
from shared.config import Settings
from shared.engine.runtime import Runtime

__all__ = ["DEFAULT_TENANT", "FacadeWebhook", "admit", "facade_webhook", "sse"]

DEFAULT_TENANT = "default"
RENDER = {"langgraph": "scheduler.interop.webhooks:langgraph_body",
          "openai": "scheduler.interop.webhooks:openai_body"}


def admit(rt: Runtime, caller: Caller, spec: AgentSpec, msgs: list[dict[str, Any]]) -> None:
    """The limits ``POST /v1/runs`` applies to a new run (413, 429), before anything is written.
    Facades only run registered agents (the operator's specs): no tenant spec policy applies."""
    limits.check_size(rt.settings, spec, msgs)
    limits.check_rate(rt, caller.limit_key)
    limits.check_in_flight(rt, caller.tenant)


class FacadeWebhook(WebhookSpec):
    """A run's webhook whose body a facade renders (``shared.store.deliveries`` calls
    ``render``); ``assistant`` is the name the client used."""

    render: str
    assistant: str = ""


def facade_webhook(
    protocol: str, settings: Settings, tenant: str, assistant: str, url: str | None = None
) -> FacadeWebhook | None:
    """The facade's webhook: the client's ``url`` (LangGraph), else the operator's default
    (``TREADLE_WEBHOOK_URL``). Both for the default tenant only are signed, with the
    operator's secret (``TREADLE_WEBHOOK_SECRET_ENV``); another tenant's are unsigned."""
    own = tenant == DEFAULT_TENANT
    if url is None and (not settings.webhook_url or not own):
        return None
    return FacadeWebhook(url=url or str(settings.webhook_url),
                         secret_env=settings.webhook_secret_env if own else None,
                         render=RENDER[protocol], assistant=assistant)


def sse(event: str, data: Any, event_id: int | None = None) -> str:
    tail = f"id: {event_id}\n" if event_id is not None else ""
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n{tail}\n"
