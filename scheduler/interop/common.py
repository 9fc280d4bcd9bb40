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


def admit(rt: Runtime, caller: Caller, agent: str, spec: AgentSpec,
          msgs: list[dict[str, Any]]) -> None:
    """The checks ``POST /v1/runs`` makes on a new run (413, 429), before anything is written.
    Facades only run registered agents, by name (the operator's specs, not policed); the
    webhook's secret env is the operator's, not the caller's."""
    limits.admit(rt, caller, agent, spec, msgs)


class FacadeWebhook(WebhookSpec):
    """A run's webhook whose body a facade renders (``shared.store.deliveries`` calls
    ``render``); ``assistant`` is the name the client used."""

    render: str
    assistant: str = ""


def facade_webhook(
    protocol: str, settings: Settings, tenant: str, assistant: str, url: str | None = None
) -> FacadeWebhook | None:
    """A facade run's webhook. LangGraph: the run's own ``webhook`` URL (without one, the run
    keeps treadle's default webhook and body). OpenAI: the operator's ``TREADLE_WEBHOOK_URL``
    (default tenant), where OpenAI's webhooks are project-wide. Signed with the operator's
    secret (``TREADLE_WEBHOOK_SECRET_ENV``) for the default tenant only."""
    own = tenant == DEFAULT_TENANT
    if protocol == "openai":
        url = str(settings.webhook_url) if settings.webhook_url and own else None
    if url is None:
        return None
    return FacadeWebhook(url=url, secret_env=settings.webhook_secret_env if own else None,
                         render=RENDER[protocol], assistant=assistant)


def sse(event: str, data: Any, event_id: int | None = None) -> str:
    tail = f"id: {event_id}\n" if event_id is not None else ""
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n{tail}\n"
