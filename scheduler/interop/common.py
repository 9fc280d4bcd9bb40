"""What both facades share: the caller's tenant, SSE framing, the facade webhook spec."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from scheduler.http import limits
from scheduler.http.agents import Resolved
from scheduler.http.auth import Caller
from shared.agent.spec import AgentSpec, WebhookSpec
from shared.config import DEFAULT_TENANT, Settings
from shared.engine import commands
from shared.engine.runtime import Runtime
from shared.engine.spec_policy import check_webhook_url
from shared.engine.webhooks import TENANT_SECRET
from shared.errors import Forbidden
from shared.store.rows import RunRecord
from shared.vocab import EventType

__all__ = [
    "DEFAULT_TENANT",
    "Content",
    "FacadeWebhook",
    "ImagePart",
    "Role",
    "TextPart",
    "admit",
    "facade_webhook",
    "progress_text",
    "submit_facade_run",
    "sse",
    "stream_responses",
]


Role = Literal["user", "human", "assistant", "ai", "system"]  # a client message's role


class TextPart(BaseModel):
    """A text part of a message's content (``shared.interop.shapes`` reads it)."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["text", "input_text", "output_text"]
    text: str = ""


class ImagePart(BaseModel):
    """An image part: a URL, or ``{"url": ...}``."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["image_url", "input_image"]
    image_url: str | dict[str, Any] | None = None


Content = str | list[Annotated[TextPart | ImagePart, Field(discriminator="type")]]


def admit(
    rt: Runtime,
    caller: Caller,
    agent: AgentSpec | str,
    spec: AgentSpec,
    msgs: list[dict[str, Any]],
) -> None:
    """The checks ``POST /v1/runs`` makes on a new run (413, 429), before anything is written.
    Facades run named agents: ``agent`` is a registered one's name (the operator's, not
    policed) or a tenant's own spec (policed); the webhook's secret env is the operator's,
    not the caller's."""
    limits.admit(rt, caller, agent, spec, msgs)


def submit_facade_run(
    rt: Runtime,
    agent: Resolved,
    msgs: str | list[dict[str, Any]],
    tenant: str,
    thread_id: str | None,
    metadata: dict[str, Any] | None,
    webhook: FacadeWebhook | None = None,
    idempotency_key: str | None = None,
) -> RunRecord:
    """Submit a new run of ``agent`` for a facade or an MCP call (admitted already: see
    ``admit``), on ``thread_id`` when it continues a thread."""
    row, _ = commands.submit_run(
        rt,
        commands.RunInput(
            agent=agent.spec,
            input=msgs,
            tenant=tenant,
            thread_id=thread_id,
            metadata=metadata,
            webhook=webhook,
            idempotency_key=idempotency_key,
            agent_ref=agent.ref,
        ),
    )
    return row


class FacadeWebhook(WebhookSpec):
    """A run's webhook whose body a facade renders: ``render`` names the renderer the store
    calls (``shared.interop.webhooks.RENDERERS``); ``assistant`` is the name the client
    used."""

    render: str
    assistant: str = ""
    # also "tenant:NAME" (a tenant's secret derived from env NAME): made here, never parsed
    # from a client's body
    secret_env: str | None = Field(
        default=None, pattern=r"^(tenant:)?[A-Za-z_][A-Za-z0-9_]{0,127}$"
    )


def facade_webhook(
    protocol: str, settings: Settings, tenant: str, assistant: str, url: str | None = None
) -> FacadeWebhook | None:
    """A facade run's webhook. LangGraph: the run's own ``webhook`` URL (without one, the run
    keeps treadle's default webhook and body); a tenant's must pass the SSRF rules (422).
    OpenAI: the operator's ``TREADLE_WEBHOOK_URL`` (default tenant), where OpenAI's webhooks
    are project-wide. Signed with the operator's secret (``TREADLE_WEBHOOK_SECRET_ENV``) for
    the default tenant, with the tenant's own secret derived from it for any other — so a
    tenant's facade webhook is always signed (Standard Webhooks, like a native one): without
    that setting it is refused (403), never sent unsigned."""
    own = tenant == DEFAULT_TENANT
    if protocol == "openai":
        url = str(settings.webhook_url) if settings.webhook_url and own else None
    if url is None:
        return None
    secret = settings.webhook_secret_env
    if not own:
        check_webhook_url(settings, url)
        if not secret:
            raise Forbidden(
                "webhook: a tenant's webhooks are signed with its own secret, derived from "
                "the operator's (TREADLE_WEBHOOK_SECRET_ENV), which this server does not set"
            )
    return FacadeWebhook(
        url=url,
        secret_env=secret if own or not secret else TENANT_SECRET + secret,
        render=protocol,
        assistant=assistant,
    )


def sse(event: str, data: Any, event_id: int | None = None) -> str:
    tail = f"id: {event_id}\n" if event_id is not None else ""
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n{tail}\n"


# an OpenAPI ``responses`` entry for a route that answers with an event stream (and, with
# ``json``, a JSON document when the body does not ask for a stream)
def stream_responses(json: bool = False) -> dict[int | str, dict[str, Any]]:
    content: dict[str, Any] = {"text/event-stream": {}}
    if json:
        content["application/json"] = {}
    return {200: {"description": "An event stream (SSE)", "content": content}}


def progress_text(event: Any) -> str:
    """A run's durable event as a line of progress (an MCP progress notification, an A2A
    status message): ``round 2``, ``tool.finished echo``, ``memory.written``."""
    data = event.get("data") or {}
    if event["type"] == EventType.ROUND_STARTED:
        return f"round {data.get('round')}"
    name = data.get("name")
    return f"{event['type']} {name}" if name else str(event["type"])
