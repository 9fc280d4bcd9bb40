"""Approve with edited arguments and reject with a message through both SDKs, with API keys:
the LangGraph facade takes LangChain's HITL decisions (``edit`` with ``edited_action``,
``reject`` with ``message``), the OpenAI facade ``mcp_approval_response`` items (``reason`` on
a reject, ``arguments`` on an approve); the model reads what ran and why not, and each decided
call and the ``run.resumed`` event name the key that decided."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import openai
import pytest
from langgraph_sdk import get_client
from langgraph_sdk.errors import UnprocessableEntityError

from tests.interop.conftest import Keyed


def _api(keyed: Keyed, path: str) -> Any:
    headers = {"Authorization": f"Bearer {keyed.keys['acme']}"}
    got = httpx.get(f"{keyed.url}/v1{path}", headers=headers, timeout=10)
    assert got.status_code == 200, got.text
    return got


def _waiting_run(keyed: Keyed) -> str:
    runs = _api(keyed, "/runs?status=waiting&limit=5").json()["runs"]
    [run] = [r for r in runs if (r.get("pending") or {}).get("kind") == "approval"]
    return str(run["id"])


def _check_records(keyed: Keyed, run_id: str, reason: str) -> None:
    calls = {
        c["call_id"]: c for c in _api(keyed, f"/runs/{run_id}/tool-calls").json()["tool_calls"]
    }
    key_id = keyed.key_ids["acme"]
    edited, rejected = calls["w1"]["decision"], calls["w2"]["decision"]
    assert (edited["action"], edited["by"]) == ("edit", key_id)
    assert edited["proposed_arguments"] == {"item": "A"} and edited["arguments"] == {"item": "A2"}
    assert (rejected["action"], rejected["by"], rejected["message"]) == ("reject", key_id, reason)
    assert calls["w1"]["result"].endswith("wrote A2")
    assert calls["w2"]["result"] == f"Declined by user: {reason}"
    events = _api(keyed, f"/runs/{run_id}/events").text
    resumed = [
        json.loads(line[len("data:") :])
        for line in events.splitlines()
        if line.startswith("data:") and '"run.resumed"' in line
    ]
    assert resumed and resumed[0]["data"]["by"] == key_id, resumed


def test_langgraph_edit_and_reject_with_a_message(keyed: Keyed) -> None:
    async def main() -> None:
        client = get_client(url=f"{keyed.url}/langgraph", api_key=keyed.keys["acme"])
        try:
            thread = await client.threads.create()
            tid = thread["thread_id"]
            hello = {"messages": [{"role": "user", "content": "write"}]}
            run = await client.runs.create(tid, "it-guard", input=hello)
            joined = await client.runs.join(tid, run["run_id"])
            value = joined["__interrupt__"][0]["value"]
            assert value["review_configs"][0]["allowed_decisions"] == ["approve", "edit", "reject"]
            run_id = _waiting_run(keyed)

            def edit(args: dict[str, Any]) -> dict[str, Any]:
                return {"type": "edit", "edited_action": {"name": "write_thing", "args": args}}

            reject = {"type": "reject", "message": "not B"}
            with pytest.raises(UnprocessableEntityError, match="write_thing"):
                bad = {"decisions": [edit({"item": 5}), reject]}  # the tool's schema says str
                await client.runs.create(tid, "it-guard", command={"resume": bad})
            good = {"decisions": [edit({"item": "A2"}), reject]}
            again = await client.runs.create(tid, "it-guard", command={"resume": good})
            values = await client.runs.join(tid, again["run_id"])
            tools = {
                m["tool_call_id"]: m["content"] for m in values["messages"] if m["type"] == "tool"
            }
            assert tools["w2"] == "Declined by user: not B"
            assert 'ran with {"item": "A2"}' in tools["w1"] and tools["w1"].endswith("wrote A2")
            proposed = [m for m in values["messages"] if m["type"] == "ai" and m.get("tool_calls")]
            assert proposed[0]["tool_calls"][1]["args"] == {"item": "A"}  # what the model asked
        finally:
            await client.aclose()
        _check_records(keyed, run_id, "not B")

    asyncio.run(asyncio.wait_for(main(), timeout=60))


def test_openai_edit_and_reject_with_a_reason(keyed: Keyed) -> None:
    client = openai.OpenAI(
        base_url=f"{keyed.url}/openai/v1", api_key=keyed.keys["acme"], max_retries=0
    )
    paused = client.responses.create(model="it-guard", input="write")
    assert [i.type for i in paused.output].count("mcp_approval_request") == 2
    run_id = _waiting_run(keyed)

    def answer(edited: Any) -> list[Any]:
        return [
            {
                "type": "mcp_approval_response",
                "approval_request_id": "mcpr_w1",
                "approve": True,
                "arguments": edited,  # a treadle extension: run with these instead
            },
            {
                "type": "mcp_approval_response",
                "approval_request_id": "mcpr_w2",
                "approve": False,
                "reason": "B is wrong",
            },
        ]

    for bad in ('{"item": 5}', "{not json", [1]):
        with pytest.raises(openai.BadRequestError):
            client.responses.create(
                model="it-guard", previous_response_id=paused.id, input=answer(bad)
            )
    done = client.responses.create(
        model="it-guard", previous_response_id=paused.id, input=answer('{"item": "A2"}')
    )
    assert done.status == "completed" and done.output_text == "Wrote A; B was declined."
    ran = [i for i in done.output if i.type == "mcp_call"]
    assert [(i.name, json.loads(i.arguments)) for i in ran] == [("write_thing", {"item": "A2"})]
    _check_records(keyed, run_id, "B is wrong")
