"""The real ``openai`` SDK drives treadle through the Responses background facade."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from openai import AsyncOpenAI, BadRequestError, NotFoundError, OpenAI
from openai.types.responses import Response

from tests.interop.conftest import SECRET, Counter, Served
from tests.support import wait_for

FINAL = ("completed", "failed", "cancelled", "incomplete")


def _client(served: Served, strict: bool = False) -> tuple[OpenAI, Counter]:
    counter = Counter()
    http = httpx2.Client(event_hooks={"request": [counter]})
    client = OpenAI(
        base_url=f"{served.url}/openai/v1",
        api_key="unused-locally",
        max_retries=0,
        http_client=http,
        _strict_response_validation=strict,
    )
    return client, counter


@pytest.fixture(params=[False, True], ids=["lenient", "strict"])
def oa(served: Served, request: pytest.FixtureRequest) -> Iterator[tuple[OpenAI, Counter]]:
    client, counter = _client(served, strict=request.param)
    yield client, counter
    client.close()


def _done(client: OpenAI, response_id: str) -> Response:
    return wait_for(
        lambda: (r := client.responses.retrieve(response_id)).status in FINAL and r,
        20,
        interval=0.1,
        what=f"response {response_id} to finish",
    )  # type: ignore[no-any-return]


def _types(response: Response) -> list[str]:
    return [item.type for item in response.output]


def test_background_poll(oa: tuple[OpenAI, Counter]) -> None:
    client, counter = oa
    created = client.responses.create(
        model="it-chat", input="hi", background=True, metadata={"ticket": "T-1"}
    )
    assert created.id.startswith("resp_") and created.status in (
        "queued",
        "in_progress",
        "completed",
    )
    assert created.background is True
    done = _done(client, created.id)
    assert done.status == "completed" and done.output_text == "Hello there, friend."
    assert _types(done) == ["message", "reasoning"]
    assert done.usage is not None and done.usage.input_tokens > 0 and done.usage.output_tokens > 0
    assert done.metadata == {"ticket": "T-1"}
    items = client.responses.input_items.list(created.id)
    assert [i.type for i in items.data] == ["message"]
    assert counter.count() < 60


def test_blocking_create_and_follow_up(oa: tuple[OpenAI, Counter]) -> None:
    client, _ = oa
    first = client.responses.create(model="it-chat", input="hi")
    assert first.status == "completed" and first.output_text == "Hello there, friend."
    second = client.responses.create(model="it-chat", input="again", previous_response_id=first.id)
    assert second.id != first.id and second.previous_response_id == first.id
    assert second.output_text == "Hello there, friend."


def test_idempotency_key_makes_a_retried_create_return_the_same_response(
    oa: tuple[OpenAI, Counter],
) -> None:
    client, _ = oa
    key = {"Idempotency-Key": f"create-{uuid.uuid4().hex}"}
    first = client.responses.create(model="it-chat", input="hi", background=True, extra_headers=key)
    again = client.responses.create(model="it-chat", input="hi", background=True, extra_headers=key)
    assert again.id == first.id
    assert _done(client, first.id).output_text == "Hello there, friend."


def test_ask_is_a_function_call_resumed_by_its_output(oa: tuple[OpenAI, Counter]) -> None:
    client, counter = oa
    paused = _done(
        client, client.responses.create(model="it-ask", input="deploy", background=True).id
    )
    assert paused.status == "completed"
    call = paused.output[-1]
    assert call.type == "function_call" and call.name == "ask_user" and call.call_id == "call_9"
    assert json.loads(call.arguments)["questions"][0]["question"] == "Env?"
    with pytest.raises(BadRequestError):  # a paused response wants the call's output
        client.responses.create(
            model="it-ask", input="what now?", previous_response_id=paused.id, background=True
        )
    resumed = client.responses.create(
        model="it-ask",
        previous_response_id=paused.id,
        background=True,
        input=[
            {
                "type": "function_call_output",
                "call_id": "call_9",
                "output": json.dumps({"answers": ["prod"]}),
            }
        ],
    )
    assert resumed.id != paused.id and resumed.previous_response_id == paused.id
    done = _done(client, resumed.id)
    assert done.output_text == "Deploying now." and _types(done) == ["message"]
    with pytest.raises(BadRequestError):  # answered already
        client.responses.create(
            model="it-ask",
            previous_response_id=paused.id,
            input=[{"type": "function_call_output", "call_id": "call_9", "output": "dev"}],
        )
    assert counter.count() < 80


def test_ask_answered_with_a_plain_string(oa: tuple[OpenAI, Counter]) -> None:
    client, _ = oa
    paused = _done(
        client, client.responses.create(model="it-ask", input="deploy", background=True).id
    )
    done = client.responses.create(
        model="it-ask",
        previous_response_id=paused.id,
        input=[{"type": "function_call_output", "call_id": "call_9", "output": "prod"}],
    )
    assert done.status == "completed" and done.output_text == "Deploying now."


def _effects(served: Served) -> list[str]:
    return served.effects.read_text().splitlines() if served.effects.exists() else []


def test_approval_requests_accept_one_reject_one(
    served: Served, oa: tuple[OpenAI, Counter]
) -> None:
    client, _ = oa
    before = _effects(served)
    paused = _done(
        client, client.responses.create(model="it-guard", input="write", background=True).id
    )
    assert _types(paused) == ["mcp_call", "mcp_approval_request", "mcp_approval_request"]
    echo = paused.output[0]
    assert echo.type == "mcp_call" and echo.name == "echo" and echo.output == "read it"
    requests = [i for i in paused.output if i.type == "mcp_approval_request"]
    assert [(r.id, r.name, json.loads(r.arguments)) for r in requests] == [
        ("mcpr_w1", "write_thing", {"item": "A"}),
        ("mcpr_w2", "write_thing", {"item": "B"}),
    ]
    with pytest.raises(BadRequestError):  # every request needs an answer
        client.responses.create(
            model="it-guard",
            previous_response_id=paused.id,
            input=[
                {"type": "mcp_approval_response", "approval_request_id": "mcpr_w1", "approve": True}
            ],
        )
    resumed = client.responses.create(
        model="it-guard",
        previous_response_id=paused.id,
        background=True,
        input=[
            {"type": "mcp_approval_response", "approval_request_id": "mcpr_w1", "approve": True},
            {
                "type": "mcp_approval_response",
                "approval_request_id": "mcpr_w2",
                "approve": False,
                "reason": "not B",
            },
        ],
    )
    done = _done(client, resumed.id)
    assert done.output_text == "Wrote A; B was declined."
    assert _types(done) == ["mcp_call", "message"]  # the approved write ran; B did not
    assert done.output[0].name == "write_thing"
    new = _effects(served)[len(before) :]
    assert len(new) == 1 and new[0].endswith(" A")


def _events(stream: Any) -> list[Any]:
    return list(stream)


def test_stream_and_resume_the_stream_after_a_cursor(oa: tuple[OpenAI, Counter]) -> None:
    client, counter = oa
    events = _events(
        client.responses.create(model="it-tool", input="ping", stream=True, background=True)
    )
    numbers = [e.sequence_number for e in events]
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert numbers == sorted(set(numbers))
    types = [e.type for e in events]
    assert "response.output_text.delta" in types and "response.output_item.added" in types
    response_id = events[0].response.id
    final = client.responses.retrieve(response_id)
    assert events[-1].response.output_text == final.output_text == "The echo said ping."
    assert _types(final) == ["mcp_call", "message", "reasoning"]
    for cursor in (numbers[2], numbers[len(numbers) // 2], numbers[-2]):
        replay = _events(client.responses.retrieve(response_id, stream=True, starting_after=cursor))
        assert replay and all(e.sequence_number > cursor for e in replay)
        durable = [e for e in events if e.type != "response.output_text.delta"]
        assert [e.sequence_number for e in replay] == [
            e.sequence_number for e in durable if e.sequence_number > cursor
        ]
        with client.responses.stream(response_id=response_id, starting_after=cursor) as helper:
            assert helper.get_final_response().output_text == final.output_text
    assert counter.count() < 40


def test_stream_helper_follows_a_live_response(oa: tuple[OpenAI, Counter]) -> None:
    client, _ = oa
    created = client.responses.create(model="it-long", input="talk", background=True)
    with client.responses.stream(response_id=created.id) as helper:
        deltas = [e.delta for e in helper if e.type == "response.output_text.delta"]
        final = helper.get_final_response()
    assert "".join(deltas) == final.output_text and final.output_text.startswith("word0 ")


def test_cancel(oa: tuple[OpenAI, Counter]) -> None:
    client, _ = oa
    created = client.responses.create(model="it-slow", input="hi", background=True)
    cancelled = client.responses.cancel(created.id)
    assert cancelled.status == "cancelled"
    assert client.responses.cancel(created.id).status == "cancelled"  # idempotent
    assert client.responses.retrieve(created.id).status == "cancelled"
    done = client.responses.create(model="it-chat", input="hi")
    with pytest.raises(BadRequestError):
        client.responses.cancel(done.id)
    with pytest.raises(NotFoundError):
        client.responses.retrieve("resp_nope")


def test_bad_requests(oa: tuple[OpenAI, Counter]) -> None:
    client, _ = oa
    with pytest.raises(BadRequestError):
        client.responses.create(
            model="it-chat",
            input="hi",
            background=True,
            tools=[{"type": "function", "name": "f", "parameters": {}}],
        )
    with pytest.raises(BadRequestError):
        client.responses.create(model="it-chat", input="hi", background=True, store=False)
    with pytest.raises(NotFoundError):
        client.responses.create(model="no-such-agent", input="hi")


def _openai_hooks(served: Served, response_id: str) -> list[Any]:
    return [
        r
        for r in served.receiver.received
        if r.json.get("object") == "event" and r.json["data"]["id"] == response_id
    ]


def test_webhooks_unwrap_with_the_openai_helper(served: Served) -> None:
    client, _ = _client(served)
    done = client.responses.create(model="it-chat", input="hi")
    hooks = wait_for(lambda: _openai_hooks(served, done.id), 15, what="the response webhook")
    event = client.webhooks.unwrap(hooks[0].body, hooks[0].headers, secret=SECRET)
    assert event.type == "response.completed" and event.data.id == done.id
    # a plain treadle delivery verifies with the same helper (Standard Webhooks)
    run = httpx2.post(f"{served.url}/v1/runs", json={"agent": "it-chat", "input": "hi"}).json()
    plain = wait_for(
        lambda: [
            r
            for r in served.receiver.received
            if r.json.get("data", {}).get("run_id") == run["id"]
            and r.json.get("type") == "run.completed"
        ],
        15,
        what="the treadle webhook",
    )
    client.webhooks.verify_signature(plain[0].body, plain[0].headers, secret=SECRET)
    unwrapped = client.webhooks.unwrap(plain[0].body, plain[0].headers, secret=SECRET)
    assert unwrapped.type == "run.completed"  # type: ignore[comparison-overlap]


def test_async_client(served: Served) -> None:
    async def main() -> None:
        client = AsyncOpenAI(
            base_url=f"{served.url}/openai/v1", api_key="unused-locally", max_retries=0
        )
        created = await client.responses.create(model="it-chat", input="hi", background=True)
        for _ in range(200):
            got = await client.responses.retrieve(created.id)
            if got.status in FINAL:
                break
            await asyncio.sleep(0.05)
        assert got.output_text == "Hello there, friend."
        stream = await client.responses.create(model="it-tool", input="x", stream=True)
        kinds = [e.type async for e in stream]
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
        await client.close()

    asyncio.run(main())
