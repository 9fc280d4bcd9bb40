"""The facades behind API keys (issue #16): langgraph-sdk sends its key as ``x-api-key``, the
OpenAI SDK as ``Authorization: Bearer``; both map to treadle keys and their tenants."""

from __future__ import annotations

import asyncio

import openai
import pytest
from langgraph_sdk import get_client, get_sync_client
from langgraph_sdk.errors import AuthenticationError, NotFoundError

from tests.interop.conftest import Keyed

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
            model="it-chat", input="hi")
