"""The facades behind API keys: langgraph-sdk sends its key as ``x-api-key``, the
OpenAI SDK as ``Authorization: Bearer``; both map to treadle keys and their tenants."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import openai
import pytest
from langgraph_sdk import get_client, get_sync_client
from langgraph_sdk.errors import AuthenticationError, ConflictError, NotFoundError
from standardwebhooks import Webhook, WebhookVerificationError

from shared.engine.webhooks import tenant_secret
from tests.interop.conftest import SECRET, Keyed
from tests.support import wait_for

HELLO = {"messages": [{"role": "user", "content": "hi"}]}


def test_langgraph_sdk_with_x_api_key(keyed: Keyed) -> None:
    url = f"{keyed.url}/langgraph"
    acme = get_sync_client(url=url, api_key=keyed.keys["acme"])
    thread = acme.threads.create()
    values = acme.runs.wait(thread["thread_id"], "it-chat", input=HELLO)
    assert values["messages"][-1]["content"] == "Hello there, friend."
    globex = get_sync_client(url=url, api_key=keyed.keys["globex"])
    with pytest.raises(NotFoundError):  # another tenant's thread does not exist for it
        globex.threads.get(thread["thread_id"])
    assert globex.threads.search() == []
    with pytest.raises(AuthenticationError):
        get_sync_client(url=url, api_key="trd_not-a-key").threads.create()

    async def keyless() -> None:
        client = get_client(url=url, api_key=None)
        try:
            with pytest.raises(AuthenticationError):
                await client.threads.create()
        finally:
            await client.aclose()

    asyncio.run(keyless())


def test_langgraph_thread_names_are_per_tenant(keyed: Keyed) -> None:
    """A thread name a client picks is its tenant's: another tenant's thread of the same name
    is neither revealed (no 409) nor in the way, and each sees its own under that name."""
    url = f"{keyed.url}/langgraph"
    acme = get_sync_client(url=url, api_key=keyed.keys["acme"])
    globex = get_sync_client(url=url, api_key=keyed.keys["globex"])
    mine = acme.threads.create(thread_id="shared-name", metadata={"owner": "acme"})
    theirs = globex.threads.create(thread_id="shared-name", metadata={"owner": "globex"})
    assert mine["thread_id"] == theirs["thread_id"] == "shared-name"
    assert acme.threads.get("shared-name")["metadata"] == {"owner": "acme"}
    assert globex.threads.get("shared-name")["metadata"] == {"owner": "globex"}
    values = acme.runs.wait("shared-name", "it-chat", input=HELLO)
    assert values["messages"][-1]["content"] == "Hello there, friend."
    [run] = acme.runs.list("shared-name")
    assert run["thread_id"] == "shared-name"
    assert acme.threads.get_state("shared-name")["checkpoint"]["thread_id"] == "shared-name"
    assert [t["thread_id"] for t in acme.threads.search(ids=["shared-name"])] == ["shared-name"]
    assert globex.runs.list("shared-name") == []
    again = acme.threads.create(thread_id="shared-name", if_exists="do_nothing")
    assert again["metadata"] == {"owner": "acme"}
    with pytest.raises(ConflictError):
        acme.threads.create(thread_id="shared-name")


def test_openai_sdk_with_bearer_key(keyed: Keyed) -> None:
    base = f"{keyed.url}/openai/v1"
    acme = openai.OpenAI(base_url=base, api_key=keyed.keys["acme"], max_retries=0)
    done = acme.responses.create(model="it-chat", input="hi")
    assert done.output_text == "Hello there, friend."
    globex = openai.OpenAI(base_url=base, api_key=keyed.keys["globex"], max_retries=0)
    with pytest.raises(openai.NotFoundError):
        globex.responses.retrieve(done.id)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=base, api_key="trd_not-a-key", max_retries=0).responses.create(
            model="it-chat", input="hi"
        )


def test_a_tenant_langgraph_webhook_is_signed_with_its_own_secret(keyed: Keyed) -> None:
    """Not unsigned, and not with the operator's secret: with the tenant's, derived from it
    (``treadle keys webhook-secret``). A webhook URL the SSRF rules refuse is a 403."""
    url = f"{keyed.url}/langgraph"
    acme = get_sync_client(url=url, api_key=keyed.keys["acme"])
    thread = acme.threads.create()
    acme.runs.wait(thread["thread_id"], "it-chat", input=HELLO, webhook=keyed.receiver.url)

    def ours() -> list[Any]:
        return [
            r for r in keyed.receiver.received if r.json.get("thread_id") == thread["thread_id"]
        ]

    wait_for(ours, 15, what="the tenant's webhook")
    [hook] = ours()
    own = Webhook(tenant_secret(SECRET, "acme"))
    assert own.verify(hook.body, hook.headers)["thread_id"] == thread["thread_id"]
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(hook.body, hook.headers)
    threads = len(acme.threads.search(limit=1000))
    with pytest.raises(httpx.HTTPStatusError) as refused:
        acme.runs.wait(thread["thread_id"], "it-chat", input=HELLO, webhook="http://10.1.2.3/h")
    assert refused.value.response.status_code == 403 and "private" in refused.value.response.text
    assert len(acme.threads.search(limit=1000)) == threads
