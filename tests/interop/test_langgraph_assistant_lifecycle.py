"""The agent lifecycle through the real ``langgraph-sdk``: ``set_latest`` is a rollback (the
agent's ``latest`` tag), versions and search reflect it, runs on the bare id take it, and
``delete`` removes the assistant (``DELETE /v1/agents/{name}``)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_client
from langgraph_sdk.errors import ConflictError, NotFoundError

from tests.interop.conftest import Served

HELLO = {"messages": [{"role": "user", "content": "hi"}]}


def _says(text: str) -> dict[str, Any]:
    return {"provider": "scripted", "replies": [{"text": text}]}


def test_set_latest_rolls_back_and_delete_removes(served: Served) -> None:
    async def main() -> None:
        client = get_client(url=f"{served.url}/langgraph", api_key="unused-locally")
        try:
            await client.assistants.create(
                "it-chat", context={"model": _says("One.")}, assistant_id="roller"
            )
            await client.assistants.update("roller", context={"model": _says("Two.")})
            assert (await client.assistants.get("roller"))["version"] == 2
            rolled = await client.assistants.set_latest("roller", 1)
            assert (rolled["assistant_id"], rolled["version"]) == ("roller", 1)
            assert (await client.assistants.get("roller"))["version"] == 1
            versions = await client.assistants.get_versions("roller")
            assert [v["version"] for v in versions] == [2, 1]
            found = await client.assistants.search(graph_id="it-chat", limit=1000)
            assert {a["version"] for a in found if a["assistant_id"] == "roller"} == {1}
            ran = await client.runs.wait(None, "roller", input=HELLO)
            assert ran["messages"][-1]["content"] == "One."
            tags = httpx.get(f"{served.url}/v1/agents/roller/tags").json()
            assert tags == {"tags": {"latest": 1}}
            with pytest.raises(NotFoundError):
                await client.assistants.set_latest("roller", 9)
            with pytest.raises(ConflictError):
                await client.assistants.delete("it-chat")  # registered: read-only
            await client.assistants.delete("roller")
            with pytest.raises(NotFoundError):
                await client.assistants.get("roller")
            with pytest.raises(NotFoundError):
                await client.assistants.get_versions("roller")
            found = await client.assistants.search(limit=1000)
            assert "roller" not in {a["assistant_id"] for a in found}
            with pytest.raises(NotFoundError):
                await client.assistants.delete("roller")
        finally:
            await client.aclose()

    asyncio.run(asyncio.wait_for(main(), timeout=60))
