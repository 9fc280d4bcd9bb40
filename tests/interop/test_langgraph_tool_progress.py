"""A tool's progress through the real ``langgraph-sdk``: ``stream_mode="custom"`` carries
the five ``tool.progress`` reports of a plugin tool, in order."""

from __future__ import annotations

import asyncio
from typing import Any

from langgraph_sdk import get_client

from tests.interop.conftest import Served

HELLO = {"messages": [{"role": "user", "content": "go"}]}
MODEL = {
    "provider": "scripted",
    "replies": [
        {"tool_calls": [{"id": "p1", "name": "progressive", "arguments": {"delay": 1.0}}]},
        {"text": "Done."},
    ],
}


def test_custom_stream_mode_carries_tool_progress(served: Served) -> None:
    async def main() -> list[dict[str, Any]]:
        client = get_client(url=f"{served.url}/langgraph", api_key="unused-locally")
        try:
            await client.assistants.create(
                "it-tool",
                context={"tools": ["progressive"], "model": MODEL},
                assistant_id="progress-bot",
            )
            custom = []
            async for part in client.runs.stream(
                None, "progress-bot", input=HELLO, stream_mode="custom"
            ):
                if part.event == "custom":
                    custom.append(part.data)
            return custom
        finally:
            await client.aclose()

    custom = asyncio.run(asyncio.wait_for(main(), timeout=60))
    progress = [c["data"] for c in custom if c.get("type") == "tool.progress"]
    assert [p["seq"] for p in progress] == [1, 2, 3, 4, 5]
    assert [p["progress"] for p in progress] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert {(p["call_id"], p["name"], p["total"]) for p in progress} == {("p1", "progressive", 5.0)}
    assert progress[-1]["message"] == "step 5 of 5"
