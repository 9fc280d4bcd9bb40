"""``/a2a/{agent}`` driven by the official ``a2a-sdk`` client: fetch the card, send a message,
stream, get ``input-required`` for an ask and answer it, cancel; push notifications as signed
webhooks; the A2A 0.3 method names; tenants kept apart."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest
from a2a.client import A2ACardResolver, Client, ClientConfig, ClientFactory
from a2a.types import a2a_pb2 as pb
from standardwebhooks import Webhook

from tests.interop.conftest import SECRET, Keyed, Served
from tests.support import wait_for


def _run(main: Callable[[], Awaitable[None]], timeout: float = 60) -> None:
    async def bounded() -> None:
        with anyio.fail_after(timeout):
            await main()

    anyio.run(bounded)


@asynccontextmanager
async def _client(
    url: str, agent: str, *, streaming: bool = True, key: str | None = None
) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with httpx.AsyncClient(headers=headers, timeout=60) as http:
        config = ClientConfig(httpx_client=http, streaming=streaming)
        client = await ClientFactory(config).create_from_url(f"{url}/a2a/{agent}")
        yield client


def _message(text: str, task_id: str = "", context_id: str = "") -> pb.Message:
    return pb.Message(
        message_id=str(uuid.uuid4()),
        role=pb.ROLE_USER,
        parts=[pb.Part(text=text)],
        task_id=task_id,
        context_id=context_id,
    )


def _request(text: str, **kw: Any) -> pb.SendMessageRequest:
    configuration = kw.pop("configuration", None)
    request = pb.SendMessageRequest(message=_message(text, **kw))
    if configuration is not None:
        request.configuration.CopyFrom(configuration)
    return request


async def _events(client: Client, request: pb.SendMessageRequest) -> list[pb.StreamResponse]:
    return [event async for event in client.send_message(request)]


def _final(events: list[pb.StreamResponse]) -> pb.TaskStatusUpdateEvent:
    """The stream's last status: its last status update, or the task it opened with (a task
    already over, or paused, when the stream began is only that)."""
    last = events[-1]
    if last.HasField("status_update"):
        return last.status_update
    task = last.task
    return pb.TaskStatusUpdateEvent(task_id=task.id, context_id=task.context_id, status=task.status)


def _artifact_text(task: pb.Task) -> str:
    return " ".join(p.text for a in task.artifacts for p in a.parts if p.HasField("text"))


def test_the_card_has_the_agents_skills(served: Served) -> None:
    async def main() -> None:
        async with httpx.AsyncClient() as http:
            resolver = A2ACardResolver(http, f"{served.url}/a2a/it-tool")
            card = await resolver.get_agent_card()
        assert card.name == "it-tool" and card.capabilities.streaming
        assert card.capabilities.push_notifications
        assert card.supported_interfaces[0].url == f"{served.url}/a2a/it-tool"
        skills = {s.name: s for s in card.skills}
        assert "it-tool" in skills and "agent" in skills["it-tool"].tags
        assert "echo" in skills and "tool" in skills["echo"].tags
        async with httpx.AsyncClient() as http:
            missing = await http.get(f"{served.url}/a2a/nope/.well-known/agent-card.json")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"

    _run(main)


def test_send_and_get(served: Served) -> None:
    async def main() -> None:
        async with _client(served.url, "it-chat", streaming=False) as client:
            (event,) = await _events(client, _request("hi"))
            task = event.task
            assert task.status.state == pb.TASK_STATE_COMPLETED
            assert _artifact_text(task) == "Hello there, friend."
            got = await client.get_task(pb.GetTaskRequest(id=task.id))
            assert got.status.state == pb.TASK_STATE_COMPLETED and got.context_id == task.context_id
            again = await _events(client, _request("and again", context_id=task.context_id))
            assert again[0].task.context_id == task.context_id  # one context: one thread
        run = httpx.get(f"{served.url}/v1/runs/{again[0].task.id}").json()
        assert run["thread_id"] == task.context_id and run["agent_ref"] == "it-chat"

    _run(main)


def test_stream_progress_artifact_and_final_status(served: Served) -> None:
    async def main() -> None:
        async with _client(served.url, "it-tool") as client:
            events = await _events(client, _request("ping please"))
        assert events[0].HasField("task")
        progress = [
            p.text
            for e in events
            if e.HasField("status_update") and e.status_update.status.HasField("message")
            for p in e.status_update.status.message.parts
        ]
        assert "tool.finished echo" in progress
        artifacts = [e.artifact_update for e in events if e.HasField("artifact_update")]
        assert artifacts[0].artifact.parts[0].text == "The echo said ping."
        assert _final(events).status.state == pb.TASK_STATE_COMPLETED

    _run(main)


def test_input_required_for_an_ask_then_answered(served: Served) -> None:
    async def main() -> None:
        async with _client(served.url, "it-ask") as client:
            events = await _events(client, _request("deploy"))
            paused = _final(events)
            assert paused.status.state == pb.TASK_STATE_INPUT_REQUIRED
            assert "Env?" in paused.status.message.parts[0].text
            task_id, context_id = paused.task_id, paused.context_id
            events = await _events(client, _request("prod", task_id=task_id, context_id=context_id))
            done = _final(events)
            assert done.status.state == pb.TASK_STATE_COMPLETED
            task = await client.get_task(pb.GetTaskRequest(id=task_id))
            assert _artifact_text(task) == "Deploying now."
            with pytest.raises(Exception, match="not waiting for input"):
                await _events(client, _request("dev", task_id=task_id))

    _run(main)


def test_an_approval_is_answered(served: Served) -> None:
    async def main() -> None:
        async with _client(served.url, "it-approve", streaming=False) as client:
            (event,) = await _events(client, _request("write A"))
            assert event.task.status.state == pb.TASK_STATE_INPUT_REQUIRED
            assert "write_thing" in event.task.status.message.parts[0].text
            (done,) = await _events(client, _request("approve", task_id=event.task.id))
            assert _artifact_text(done.task) == "Wrote A."

    _run(main)


def test_cancel(served: Served) -> None:
    async def main() -> None:
        configuration = pb.SendMessageConfiguration(return_immediately=True)
        async with _client(served.url, "it-12s", streaming=False) as client:
            (event,) = await _events(client, _request("slowly", configuration=configuration))
            task_id = event.task.id
            assert event.task.status.state in (pb.TASK_STATE_SUBMITTED, pb.TASK_STATE_WORKING)
            cancelled = await client.cancel_task(pb.CancelTaskRequest(id=task_id))
            assert cancelled.status.state == pb.TASK_STATE_CANCELED
            got = await client.get_task(pb.GetTaskRequest(id=task_id))
            assert got.status.state == pb.TASK_STATE_CANCELED
            with pytest.raises(Exception, match="already cancelled"):
                await client.cancel_task(pb.CancelTaskRequest(id=task_id))

    _run(main)


def test_push_notifications_are_signed_webhooks(served: Served) -> None:
    async def main() -> None:
        push = pb.TaskPushNotificationConfig(url=served.receiver.url)
        configuration = pb.SendMessageConfiguration(task_push_notification_config=push)
        async with _client(served.url, "it-ask", streaming=False) as client:
            (event,) = await _events(client, _request("deploy", configuration=configuration))
            task_id = event.task.id
            await _events(client, _request("dev", task_id=task_id))

        def hooks() -> list[Any]:
            return [
                r
                for r in served.receiver.received
                if (r.json.get("task") or {}).get("id") == task_id
            ]

        await anyio.to_thread.run_sync(lambda: wait_for(lambda: len(hooks()) >= 2, 15))
        states = [h.json["task"]["status"]["state"] for h in hooks()]
        assert states[:2] == ["TASK_STATE_INPUT_REQUIRED", "TASK_STATE_COMPLETED"]
        for hook in hooks():
            Webhook(SECRET).verify(hook.body, hook.headers)

    _run(main)


def test_the_0_3_method_names(served: Served) -> None:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "message/send",
        "params": {
            "message": {
                "kind": "message",
                "messageId": str(uuid.uuid4()),
                "role": "user",
                "parts": [{"kind": "text", "text": "hi"}],
            }
        },
    }
    sent = httpx.post(f"{served.url}/a2a/it-chat", json=body, timeout=30).json()
    assert sent["result"]["status"]["state"] == "completed", sent
    task_id = sent["result"]["id"]
    body = {"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": {"id": task_id}}
    got = httpx.post(f"{served.url}/a2a/it-chat", json=body, timeout=30).json()
    assert got["result"]["artifacts"][0]["parts"][0]["text"] == "Hello there, friend."


def test_tenants_see_only_their_own_tasks(keyed: Keyed) -> None:
    async def main() -> None:
        async with _client(keyed.url, "it-chat", streaming=False, key=keyed.keys["acme"]) as acme:
            (event,) = await _events(acme, _request("hi"))
        async with _client(keyed.url, "it-chat", streaming=False, key=keyed.keys["globex"]) as gx:
            with pytest.raises(Exception, match="not found"):
                await gx.get_task(pb.GetTaskRequest(id=event.task.id))
            with pytest.raises(Exception, match="not found"):
                await gx.cancel_task(pb.CancelTaskRequest(id=event.task.id))
        async with httpx.AsyncClient() as anonymous:
            refused = await anonymous.get(f"{keyed.url}/a2a/it-chat/.well-known/agent-card.json")
            assert refused.status_code == 401

    _run(main)
