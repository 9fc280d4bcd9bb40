"""The real ``langgraph-sdk`` drives treadle through the LangGraph facade."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from langgraph_sdk import get_client, get_sync_client
from langgraph_sdk.client import LangGraphClient
from langgraph_sdk.errors import ConflictError, NotFoundError, UnprocessableEntityError
from standardwebhooks import Webhook

from tests.interop.conftest import SECRET, Counter, Served
from tests.support import wait_for

HELLO = {"messages": [{"role": "user", "content": "hi"}]}


def _client(served: Served) -> tuple[LangGraphClient, Counter]:
    client = get_client(url=f"{served.url}/langgraph", api_key="unused-locally")
    counter = Counter()
    client.http.client.event_hooks["request"].append(counter.async_hook)
    return client, counter


def _run(served: Served, test: Callable[[LangGraphClient, Counter], Awaitable[None]]) -> None:
    async def main() -> None:
        client, counter = _client(served)
        try:
            await asyncio.wait_for(test(client, counter), timeout=60)
        finally:
            await client.aclose()

    asyncio.run(main())


def _last(values: dict[str, Any]) -> dict[str, Any]:
    return dict(values["messages"][-1])


async def _paused(client: LangGraphClient, assistant: str) -> tuple[str, str, dict[str, Any]]:
    thread = await client.threads.create()
    run = await client.runs.create(thread["thread_id"], assistant, input=HELLO)
    joined = await client.runs.join(thread["thread_id"], run["run_id"])
    return thread["thread_id"], run["run_id"], joined


def test_submit_join_get_list(served: Served) -> None:
    async def test(client: LangGraphClient, counter: Counter) -> None:
        created: list[Any] = []
        thread = await client.threads.create(metadata={"user": "u1"})
        tid = thread["thread_id"]
        run = await client.runs.create(tid, "it-chat", input=HELLO, on_run_created=created.append)
        assert created[0]["run_id"] == run["run_id"] and created[0]["thread_id"] == tid
        assert run["status"] in ("pending", "running", "success")
        values = await client.runs.join(tid, run["run_id"])
        assert [m["type"] for m in values["messages"]] == ["human", "ai"]
        assert _last(values)["content"] == "Hello there, friend."
        assert (await client.runs.get(tid, run["run_id"]))["status"] == "success"
        got = await client.threads.get(tid)
        assert got["status"] == "idle" and got["metadata"] == {"user": "u1"}
        assert got["values"]["messages"][-1]["content"] == "Hello there, friend."
        state = await client.threads.get_state(tid)
        assert state["next"] == [] and state["interrupts"] == []
        second = await client.runs.create(tid, "it-chat", input=HELLO)
        await client.runs.join(tid, second["run_id"])
        listed = await client.runs.list(tid)
        assert [r["run_id"] for r in listed] == [second["run_id"], run["run_id"]]  # newest first
        history = await client.threads.get_history(tid)
        assert history and len(history[0]["values"]["messages"]) == 4
        found = await client.threads.search(metadata={"user": "u1"}, status="idle")
        assert [t["thread_id"] for t in found] == [tid]
        assert counter.count() < 15

    _run(served, test)


@pytest.mark.parametrize(
    "resume",
    [
        {"decisions": [{"type": "respond", "message": "prod"}]},
        "prod",
        ["prod"],
        {"answers": ["prod"]},
        {"call_9": "prod"},
        [{"type": "response", "args": "prod"}],
        {"decisions": [{"type": "reject", "message": "prod"}]},
    ],
)
def test_ask_interrupts_and_resumes(served: Served, resume: Any) -> None:
    async def test(client: LangGraphClient, counter: Counter) -> None:
        tid, first, joined = await _paused(client, "it-ask")
        interrupt = joined["__interrupt__"][0]
        assert interrupt["id"] == "call_9"
        request = interrupt["value"]["action_requests"][0]
        assert request["name"] == "ask_user" and request["args"]["question"] == "Env?"
        assert interrupt["value"]["review_configs"][0]["allowed_decisions"] == ["respond", "reject"]
        assert (await client.runs.get(tid, first))["status"] == "success"
        assert (await client.threads.get(tid))["status"] == "interrupted"
        state = await client.threads.get_state(tid)
        assert state["next"] == ["ask_user"] and state["interrupts"][0]["id"] == "call_9"
        run = await client.runs.create(tid, "it-ask", command={"resume": resume})
        assert run["run_id"] != first
        values = await client.runs.join(tid, run["run_id"])
        assert _last(values)["content"] == "Deploying now."
        tool = next(m for m in values["messages"] if m["type"] == "tool")
        assert "Answer: Prod - prod" in tool["content"]
        assert (await client.threads.get(tid))["status"] == "idle"
        assert [r["run_id"] for r in await client.runs.list(tid)] == [run["run_id"], first]

    _run(served, test)


def test_bad_resumes_and_busy_threads(served: Served) -> None:
    async def test(client: LangGraphClient, counter: Counter) -> None:
        tid, _, _ = await _paused(client, "it-ask")
        with pytest.raises(UnprocessableEntityError):
            await client.runs.create(
                tid, "it-ask", command={"resume": {"decisions": [{"type": "approve"}]}}
            )
        with pytest.raises(UnprocessableEntityError):
            await client.runs.create(tid, "it-ask", command={"resume": True})
        with pytest.raises(ConflictError):
            await client.runs.create(tid, "it-ask", command={"resume": {"call_other": "x"}})
        with pytest.raises(ConflictError):  # new input on an interrupted thread
            await client.runs.create(tid, "it-ask", input=HELLO)
        with pytest.raises(NotFoundError):
            await client.threads.get("no-such-thread")
        with pytest.raises(NotFoundError):
            await client.runs.create(
                tid, "no-such-agent", input=HELLO, multitask_strategy="interrupt"
            )
        # interrupt: the waiting run is cancelled, the new one starts
        run = await client.runs.create(tid, "it-chat", input=HELLO, multitask_strategy="interrupt")
        values = await client.runs.join(tid, run["run_id"])
        assert _last(values)["content"] == "Hello there, friend."
        idle, _, _ = await _paused(client, "it-chat")
        with pytest.raises(ConflictError):
            await client.runs.create(idle, "it-chat", command={"resume": "x"})

    _run(served, test)


def _effects(served: Served) -> list[str]:
    return served.effects.read_text().splitlines() if served.effects.exists() else []


def test_approval_accept_one_reject_one(served: Served) -> None:
    async def test(client: LangGraphClient, counter: Counter) -> None:
        before = _effects(served)
        tid, _, joined = await _paused(client, "it-guard")
        value = joined["__interrupt__"][0]["value"]
        assert [r["name"] for r in value["action_requests"]] == ["write_thing", "write_thing"]
        assert [r["args"]["item"] for r in value["action_requests"]] == ["A", "B"]
        assert value["review_configs"] == [
            {"action_name": "write_thing", "allowed_decisions": ["approve", "edit", "reject"]}
        ]
        assert (await client.threads.get_state(tid))["next"] == ["tools"]
        for bad in (
            {"decisions": [{"type": "edit", "edited_action": {}}, {"type": "approve"}]},
            {"decisions": [{"type": "approve"}]},
            "yes",
        ):
            with pytest.raises(UnprocessableEntityError):
                await client.runs.create(tid, "it-guard", command={"resume": bad})
        run = await client.runs.create(
            tid,
            "it-guard",
            command={
                "resume": {
                    "decisions": [{"type": "approve"}, {"type": "reject", "message": "not B"}]
                }
            },
        )
        values = await client.runs.join(tid, run["run_id"])
        assert _last(values)["content"] == "Wrote A; B was declined."
        tools = {m["tool_call_id"]: m["content"] for m in values["messages"] if m["type"] == "tool"}
        assert tools["w2"] == "Declined by user: not B" and tools["r1"] == "read it"
        new = _effects(served)[len(before) :]
        assert len(new) == 1 and new[0].endswith(" A")  # A ran once; B never

    _run(served, test)


async def _collect(parts: Any) -> list[Any]:
    return [p async for p in parts]


def test_stream_modes(served: Served) -> None:
    async def test(client: LangGraphClient, counter: Counter) -> None:
        thread = await client.threads.create()
        tid = thread["thread_id"]
        started = time.monotonic()
        parts = await _collect(
            client.runs.stream(
                tid, "it-tool", input=HELLO, stream_mode=["values", "messages-tuple", "updates"]
            )
        )
        assert time.monotonic() - started < 10
        assert parts[0].event == "metadata"
        run_id = parts[0].data["run_id"]
        final = [p for p in parts if p.event == "values"][-1].data
        ai = _last(final)
        assert ai["type"] == "ai" and ai["content"] == "The echo said ping."
        chunks = [
            p.data[0]
            for p in parts
            if p.event == "messages" and p.data[0]["type"] == "AIMessageChunk"
        ]
        assert chunks and {c["id"] for c in chunks} == {ai["id"]}
        assert "".join(c["content"] for c in chunks) == ai["content"]
        assert any(p.event == "messages" and p.data[0]["type"] == "tool" for p in parts)
        updates = [p.data for p in parts if p.event == "updates"]
        assert any("agent" in u for u in updates) and any("tools" in u for u in updates)
        assert counter.count(f"/runs/{run_id}", "GET") <= 1  # the SDK's run check at the end
        assert counter.count() <= 3  # the thread, the stream, the check: no reconnect loop
        assert (await client.runs.get(tid, run_id))["status"] == "success"

    _run(served, test)


def test_stream_v2_values_carry_the_interrupt(served: Served) -> None:
    async def test(client: LangGraphClient, counter: Counter) -> None:
        thread = await client.threads.create()
        parts = await _collect(
            client.runs.stream(
                thread["thread_id"], "it-ask", input=HELLO, stream_mode="values", version="v2"
            )
        )
        last = parts[-1]
        assert last["type"] == "values" and last["interrupts"][0]["id"] == "call_9"
        assert last["data"]["messages"][-1]["tool_calls"][0]["name"] == "ask_user"
        assert counter.count() < 10

    _run(served, test)


def test_stream_events_and_custom_modes(served: Served) -> None:
    async def test(client: LangGraphClient, counter: Counter) -> None:
        thread = await client.threads.create()
        parts = await _collect(
            client.runs.stream(
                thread["thread_id"], "it-tool", input=HELLO, stream_mode=["events", "custom"]
            )
        )
        kinds = {p.data["event"] for p in parts if p.event == "events"}
        assert {"on_chat_model_stream", "on_tool_start", "on_tool_end"} <= kinds
        custom = [p.data["type"] for p in parts if p.event == "custom"]
        assert custom[0] == "run.queued" and custom[-1] == "run.completed"
        assert "text.delta" in custom and "tool.finished" in custom

    _run(served, test)


def test_stream_cancels_on_disconnect(served: Served) -> None:
    async def test(client: LangGraphClient, counter: Counter) -> None:
        thread = await client.threads.create()
        tid = thread["thread_id"]
        stream = client.runs.stream(tid, "it-slow", input=HELLO, on_disconnect="cancel")
        first = await anext(stream)
        assert first.event == "metadata"
        await stream.aclose()  # the client goes away while the model works
        run_id = first.data["run_id"]

        async def cancelled() -> bool:
            return (await client.runs.get(tid, run_id))["status"] == "interrupted"

        for _ in range(100):
            if await cancelled():
                break
            await asyncio.sleep(0.05)
        assert await cancelled()
        assert (await client.threads.get(tid))["status"] == "idle"

    _run(served, test)


def _body(parts: list[Any]) -> list[tuple[str, str]]:
    return [(p.event, json.dumps(p.data, sort_keys=True)) for p in parts if p.event != "metadata"]


def _after(parts: list[Any], last_id: str) -> list[tuple[str, str]]:
    """What a client that saw up to ``last_id`` has not seen (an SSE id is the last one sent,
    so the parts of the next event before its own id carry it too)."""
    cut = next(i for i, p in enumerate(parts) if p.id == last_id)
    return _body(parts[cut + 1 :])


def test_join_stream_replays_after_last_event_id(served: Served) -> None:
    async def test(client: LangGraphClient, counter: Counter) -> None:
        thread = await client.threads.create()
        tid = thread["thread_id"]
        run = await client.runs.create(
            tid, "it-tool", input=HELLO, stream_mode=["values", "updates"]
        )
        await client.runs.join(tid, run["run_id"])
        full = await _collect(client.runs.join_stream(tid, run["run_id"]))
        ids = list(dict.fromkeys(p.id for p in full if p.id))
        assert len(ids) >= 4 and ids == sorted(ids, key=int)
        for mid in ids:
            rest = await _collect(client.runs.join_stream(tid, run["run_id"], last_event_id=mid))
            assert _body(rest) == _after(full, mid)  # no duplicate, no gap
        assert counter.count() < 30

    _run(served, test)


def test_reconnect_a_live_stream_midway(served: Served) -> None:
    async def test(client: LangGraphClient, counter: Counter) -> None:
        thread = await client.threads.create()
        tid = thread["thread_id"]
        run = await client.runs.create(
            tid, "it-tool", input=HELLO, stream_mode=["values", "updates"]
        )
        seen: list[Any] = []
        async for part in client.runs.join_stream(tid, run["run_id"]):
            seen.append(part)
            if part.id:
                break  # drop the connection after the first durable event
        rest = await _collect(
            client.runs.join_stream(tid, run["run_id"], last_event_id=seen[-1].id)
        )
        whole = await _collect(client.runs.join_stream(tid, run["run_id"]))
        assert _body(seen) + _body(rest) == _body(whole)
        assert (
            _last([p for p in rest if p.event == "values"][-1].data)["content"]
            == "The echo said ping."
        )

    _run(served, test)


def test_cancel(served: Served) -> None:
    async def test(client: LangGraphClient, counter: Counter) -> None:
        thread = await client.threads.create()
        tid = thread["thread_id"]
        run = await client.runs.create(tid, "it-slow", input=HELLO)
        assert await client.runs.cancel(tid, run["run_id"]) is None
        assert (await client.runs.get(tid, run["run_id"]))["status"] == "interrupted"
        assert (await client.threads.get(tid))["status"] == "idle"
        other = await client.runs.create(tid, "it-slow", input=HELLO)
        values = await client.runs.cancel(tid, other["run_id"], wait=True)
        assert values["messages"][-1]["type"] == "human"
        assert (await client.runs.get(tid, other["run_id"]))["status"] == "interrupted"
        with pytest.raises(ConflictError):
            await client.runs.cancel(tid, other["run_id"])
        listed = await client.runs.list(tid)
        assert [r["run_id"] for r in listed] == [other["run_id"], run["run_id"]]
        assert [r["status"] for r in listed] == ["interrupted", "interrupted"]

    _run(served, test)


def _lg_hooks(served: Served, thread_id: str) -> list[Any]:
    return [
        r
        for r in served.receiver.received
        if "values" in r.json and r.json.get("thread_id") == thread_id
    ]


def test_webhook_once_per_run(served: Served) -> None:
    async def test(client: LangGraphClient, counter: Counter) -> None:
        hook = served.receiver.url
        thread = await client.threads.create()
        tid = thread["thread_id"]
        first = await client.runs.create(tid, "it-ask", input=HELLO, webhook=hook)
        await client.runs.join(tid, first["run_id"])
        second = await client.runs.create(tid, "it-ask", command={"resume": "prod"}, webhook=hook)
        await client.runs.join(tid, second["run_id"])
        got = await asyncio.to_thread(
            wait_for, lambda: len(_lg_hooks(served, tid)) >= 2, 15, what="two LangGraph webhooks"
        )
        assert got
        hooks = sorted(_lg_hooks(served, tid), key=lambda r: r.json["run_ended_at"])
        assert [h.json["run_id"] for h in hooks] == [first["run_id"], second["run_id"]]
        assert [h.json["status"] for h in hooks] == ["success", "success"]
        assert hooks[0].json["values"]["__interrupt__"][0]["id"] == "call_9"
        assert hooks[1].json["values"]["messages"][-1]["content"] == "Deploying now."
        Webhook(SECRET).verify(hooks[0].body, hooks[0].headers)
        await asyncio.sleep(1)
        assert len(_lg_hooks(served, tid)) == 2

    _run(served, test)


def test_sync_client_and_info(served: Served) -> None:
    client = get_sync_client(url=f"{served.url}/langgraph", api_key="unused-locally")
    thread = client.threads.create()
    values = client.runs.wait(thread["thread_id"], "it-chat", input=HELLO)
    assert values["messages"][-1]["content"] == "Hello there, friend."
    stateless = client.runs.wait(None, "it-chat", input=HELLO)
    assert stateless["messages"][-1]["type"] == "ai"
    assistants = client.assistants.search(limit=100)
    assert "it-chat" in {a["assistant_id"] for a in assistants}
    assert client.assistants.get("it-ask")["graph_id"] == "it-ask"
    assert client.http.get("/info")["flags"]["assistants"] is True


def _says(text: str) -> dict[str, Any]:
    return {"provider": "scripted", "replies": [{"text": text}]}


def test_assistants_create_update_versions_and_run_an_old_version(served: Served) -> None:
    async def test(client: LangGraphClient, counter: Counter) -> None:
        made = await client.assistants.create(
            "it-chat",
            context={"model": _says("Version one here.")},
            assistant_id="greeter",
            name="Greeter",
            metadata={"team": "a"},
        )
        assert (made["assistant_id"], made["version"], made["name"]) == ("greeter", 1, "Greeter")
        assert made["graph_id"] == "it-chat"
        updated = await client.assistants.update(
            "greeter", context={"model": _says("Version two here.")}, metadata={"stage": "b"}
        )
        assert updated["version"] == 2
        assert updated["metadata"] == {"team": "a", "stage": "b"}
        versions = await client.assistants.get_versions("greeter")
        assert [v["version"] for v in versions] == [2, 1]
        assert (await client.assistants.get("greeter"))["version"] == 2
        found = await client.assistants.search(graph_id="it-chat", limit=100)
        assert "greeter" in {a["assistant_id"] for a in found}

        thread = await client.threads.create()
        old = await client.runs.wait(thread["thread_id"], "greeter@1", input=HELLO)
        assert _last(old)["content"] == "Version one here."  # version 1 after version 2
        latest = await client.runs.wait(None, "greeter", input=HELLO)
        assert _last(latest)["content"] == "Version two here."

        with pytest.raises(ConflictError):
            await client.assistants.create("it-chat", assistant_id="greeter")
        same = await client.assistants.create(
            "it-chat", assistant_id="greeter", if_exists="do_nothing"
        )
        assert same["version"] == 2
        with pytest.raises(ConflictError):
            await client.assistants.update("it-chat", context={"system_prompt": "x"})
        with pytest.raises(UnprocessableEntityError):
            await client.assistants.create("it-chat", context={"no_such_field": 1})

    _run(served, test)
