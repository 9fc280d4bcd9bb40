"""Time travel through the real ``langgraph-sdk``: a run from an earlier checkpoint of the
thread (``checkpoint_id``) is a fork of treadle's run at that round, sharing its history."""

from __future__ import annotations

import asyncio
from typing import Any

from langgraph_sdk import get_client
from langgraph_sdk.errors import NotFoundError

from tests.interop.conftest import Served

HELLO = {"messages": [{"role": "user", "content": "hi"}]}


def test_a_run_from_an_earlier_checkpoint_answers_differently(served: Served) -> None:
    async def main() -> None:
        client = get_client(url=f"{served.url}/langgraph", api_key="unused-locally")
        try:
            thread = await client.threads.create()
            tid = thread["thread_id"]
            first = await client.runs.create(tid, "it-ask", input=HELLO)
            await client.runs.join(tid, first["run_id"])
            paused = await client.threads.get_state(tid)
            assert paused["next"] == ["ask_user"]
            checkpoint = paused["checkpoint"]["checkpoint_id"]
            resumed = await client.runs.create(tid, "it-ask", command={"resume": "prod"})
            done = await client.runs.join(tid, resumed["run_id"])
            assert "Prod - prod" in _tool(done)["content"]

            history = await client.threads.get_history(tid)
            assert checkpoint in {h["checkpoint"]["checkpoint_id"] for h in history}
            again = await client.runs.create(
                tid, "it-ask", command={"resume": "dev"}, checkpoint_id=checkpoint
            )
            values = await client.runs.join(tid, again["run_id"])
            assert [m["type"] for m in values["messages"]] == ["human", "ai", "tool", "ai"]
            assert "Dev - dev" in _tool(values)["content"]
            assert values["messages"][-1]["content"] == "Deploying now."
            state = await client.threads.get_state(tid)
            assert state["parent_checkpoint"]["checkpoint_id"] == checkpoint
            assert "Dev - dev" in _tool(state["values"])["content"]
            later = await client.threads.get_history(tid)
            assert state["checkpoint"]["checkpoint_id"] in {
                h["checkpoint"]["checkpoint_id"] for h in later
            }
            try:
                await client.runs.create(tid, "it-chat", input=HELLO, checkpoint_id="run_x:1")
                raise AssertionError("an unknown checkpoint must be a 404")
            except NotFoundError:
                pass
        finally:
            await client.aclose()

    asyncio.run(asyncio.wait_for(main(), timeout=60))


def _tool(values: dict[str, Any]) -> dict[str, Any]:
    return dict(next(m for m in values["messages"] if m["type"] == "tool"))
