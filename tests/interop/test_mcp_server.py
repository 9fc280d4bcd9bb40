"""``/mcp`` driven by the official ``mcp`` SDK's client (its 2026-07-28 protocol by default, and
a 2025 session with ``mode="legacy"``): agents listed as tools, a short run answered in the call
with progress, a long run (a 12 s model) answered with its id and read later, an ask answered
through elicitation or through the resume token, an approval elicited, a cancelled call
cancelling its run, and tenants kept apart."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import httpx
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.interop.conftest import Keyed, Served

MODES = ["auto", "legacy"]  # the SDK's default (2026-07-28) and a 2025 session


def _run(main: Callable[[], Awaitable[None]], timeout: float = 90) -> None:
    async def bounded() -> None:
        with anyio.fail_after(timeout):
            await main()

    anyio.run(bounded)


def _client(url: str, mode: str = "auto", key: str | None = None, **kw: Any) -> Client:
    if key is None:
        return Client(f"{url}/mcp", mode=mode, **kw)
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=60)
    return Client(streamable_http_client(f"{url}/mcp", http_client=http), mode=mode, **kw)


def _resource(result: types.ReadResourceResult) -> dict[str, Any]:
    content = result.contents[0]
    assert isinstance(content, types.TextResourceContents)
    return dict(json.loads(content.text))


def _text(result: types.CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, types.TextContent))


@pytest.mark.parametrize("mode", MODES)
def test_agents_are_tools_and_a_short_run_answers_in_the_call(served: Served, mode: str) -> None:
    async def main() -> None:
        progress: list[tuple[float, str | None]] = []

        async def on_progress(p: float, total: float | None, message: str | None) -> None:
            progress.append((p, message))

        async with _client(served.url, mode) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert {"demo", "it-chat", "it-tool", "it-ask"} <= set(tools)
            assert tools["it-chat"].input_schema["required"] == ["input"]
            assert tools["it-struct"].output_schema is not None
            result = await client.call_tool(
                "it-tool", {"input": "hi"}, progress_callback=on_progress
            )
            assert not result.is_error and _text(result) == "The echo said ping."
            assert result.structured_content is not None
            assert result.structured_content["status"] == "completed"
            messages = [m for _, m in progress]
            assert "round 1" in messages and "tool.finished echo" in messages
            assert [p for p, _ in progress] == sorted(p for p, _ in progress)
            structured = await client.call_tool("it-struct", {"input": "weather?"})
            assert structured.structured_content == {"city": "Paris", "temp_c": 21}
            bad = await client.call_tool("it-chat", {"nope": 1})
            assert bad.is_error and "input" in _text(bad)

    _run(main)


def test_a_long_run_answers_with_its_id_and_is_read_later(served: Served) -> None:
    async def main() -> None:
        async with _client(served.url) as client:
            started = time.monotonic()
            result = await client.call_tool("it-12s", {"input": "take your time"})
            # the call's wait (5 s here), not the run's (12 s)
            assert time.monotonic() - started < 11
            handle = result.structured_content
            assert handle is not None and handle["status"] in ("queued", "running")
            assert handle["resource"] == f"treadle://runs/{handle['run_id']}"
            assert any(isinstance(c, types.ResourceLink) for c in result.content)
            templates = await client.list_resource_templates()
            assert templates.resource_templates[0].uri_template == "treadle://runs/{run_id}"
            early = _resource(await client.read_resource(handle["resource"]))
            assert early["status"] in ("queued", "running")
            while True:  # the client reads the resource later
                run = _resource(await client.read_resource(handle["resource"]))
                if run["status"] == "completed":
                    break
                await anyio.sleep(1)
            assert run["result"]["text"] == "Finally done."

    _run(main, timeout=120)


def test_subscribing_to_a_run_tells_when_it_moves(served: Served) -> None:
    """A 2025 session subscribes to a running run's resource and hears it end."""

    async def main() -> None:
        updates: list[str] = []

        async def on_message(message: Any) -> None:
            root = getattr(message, "root", message)
            if isinstance(root, types.ResourceUpdatedNotification):
                updates.append(str(root.params.uri))

        async with _client(served.url, "legacy", message_handler=on_message) as client:
            body = {"agent": "it-slow", "input": "hi"}
            run = httpx.post(f"{served.url}/v1/runs", json=body).json()
            uri = f"treadle://runs/{run['id']}"
            await client.subscribe_resource(uri)
            with anyio.fail_after(30):
                while _resource(await client.read_resource(uri))["status"] != "completed":
                    await anyio.sleep(0.5)
                while not updates:
                    await anyio.sleep(0.2)
            assert set(updates) == {uri}

    _run(main)


def test_listening_to_a_run_tells_when_it_moves(served: Served) -> None:
    """The 2026-07-28 protocol: a listen stream on the run's resource hears it end."""

    async def main() -> None:
        async with _client(served.url) as client:
            run = httpx.post(f"{served.url}/v1/runs", json={"agent": "it-slow", "input": "hi"})
            uri = f"treadle://runs/{run.json()['id']}"
            async with client.listen(resource_subscriptions=[uri]) as sub:
                with anyio.fail_after(30):
                    async for event in sub:
                        assert getattr(event, "uri", None) == uri
                        if _resource(await client.read_resource(uri))["status"] == "completed":
                            break

    _run(main)


@pytest.mark.parametrize("mode", MODES)
def test_an_ask_is_answered_through_elicitation(served: Served, mode: str) -> None:
    async def main() -> None:
        asked: list[types.ElicitRequestParams] = []

        async def elicit(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
            asked.append(params)
            return types.ElicitResult(action="accept", content={"answer_1": "prod"})

        async with _client(served.url, mode, elicitation_callback=elicit) as client:
            result = await client.call_tool("it-ask", {"input": "deploy"})
            assert not result.is_error and _text(result) == "Deploying now."
            (form,) = asked
            assert isinstance(form, types.ElicitRequestFormParams)
            prop = form.requested_schema["properties"]["answer_1"]
            assert prop["title"] == "Env?" and {"const": "prod", "title": "Prod"} in prop["oneOf"]
            run_id = result.structured_content["run_id"]  # type: ignore[index]
        messages = httpx.get(f"{served.url}/v1/runs/{run_id}/messages").json()["messages"]
        assert any("Answer: Prod - prod" in str(m["content"]) for m in messages)

    _run(main)


def test_an_approval_is_elicited(served: Served) -> None:
    async def main() -> None:
        async def elicit(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
            assert isinstance(params, types.ElicitRequestFormParams)
            assert params.requested_schema["properties"]["approve_1"]["type"] == "boolean"
            return types.ElicitResult(action="accept", content={"approve_1": True})

        async with _client(served.url, elicitation_callback=elicit) as client:
            result = await client.call_tool("it-approve", {"input": "write A"})
            assert _text(result) == "Wrote A."

    _run(main)


@pytest.mark.parametrize("mode", MODES)
def test_without_elicitation_the_pause_comes_with_a_resume_token(served: Served, mode: str) -> None:
    async def main() -> None:
        async with _client(served.url, mode) as client:
            result = await client.call_tool("it-ask", {"input": "deploy"})
            handle = result.structured_content
            assert handle is not None and handle["status"] == "waiting"
            assert handle["pause"]["questions"][0]["question"] == "Env?"
            resume = handle["resume"]
            assert resume["token"].startswith("rtk_") and resume["kind"] == "ask"
            answered = httpx.post(
                served.url + resume["path"],
                json={"ask_id": resume["pause_id"], "answers": ["prod"]},
                headers={"X-Resume-Token": resume["token"]},
            )
            assert answered.status_code == 200, answered.text
            with anyio.fail_after(20):
                while (run := _resource(await client.read_resource(handle["resource"])))[
                    "status"
                ] != "completed":
                    await anyio.sleep(0.3)
            assert run["result"]["text"] == "Deploying now."
            again = httpx.post(
                served.url + resume["path"],
                json={"ask_id": resume["pause_id"], "answers": ["dev"]},
                headers={"X-Resume-Token": resume["token"]},
            )
            assert again.status_code == 409  # single use

    _run(main)


@pytest.mark.parametrize("mode", MODES)
def test_cancelling_the_call_cancels_the_run(served: Served, mode: str) -> None:
    async def main() -> None:
        before = {r["id"] for r in httpx.get(f"{served.url}/v1/runs").json()["runs"]}
        async with _client(served.url, mode) as client:
            with anyio.move_on_after(2):
                await client.call_tool("it-12s", {"input": "never mind"})
            with anyio.fail_after(15):
                while True:
                    runs = httpx.get(f"{served.url}/v1/runs").json()["runs"]
                    mine = [r for r in runs if r["id"] not in before]
                    if mine and mine[0]["status"] == "cancelled":
                        break
                    await anyio.sleep(0.3)

    _run(main)


def test_tenants_see_only_their_own_agents(keyed: Keyed) -> None:
    spec = {
        "kind": "chat",
        "model": {"provider": "scripted", "replies": [{"text": "acme says hi"}]},
    }
    made = httpx.post(
        f"{keyed.url}/v1/agents",
        json={"name": "acme-bot", "spec": spec, "description": "Acme's own"},
        headers={"Authorization": f"Bearer {keyed.keys['acme']}"},
    )
    if made.status_code == 422 and "scripted" in made.text:
        pytest.skip("test models are off with auth required")
    assert made.status_code in (201, 409), made.text

    async def main() -> None:
        async with _client(keyed.url, key=keyed.keys["acme"]) as acme:
            names = {t.name for t in (await acme.list_tools()).tools}
            assert "acme-bot" in names
        async with _client(keyed.url, key=keyed.keys["globex"]) as globex:
            names = {t.name for t in (await globex.list_tools()).tools}
            assert "acme-bot" not in names and "it-chat" in names
            with pytest.raises(Exception, match="unknown tool"):
                await globex.call_tool("acme-bot", {"input": "hi"})
        async with httpx.AsyncClient() as anonymous:
            refused = await anonymous.post(f"{keyed.url}/mcp", json={})
            assert refused.status_code == 401
            assert refused.json()["error"]["code"] == "unauthorized"

    _run(main)
