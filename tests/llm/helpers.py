"""Helpers for the model-client tests: the recorded fixtures and MockTransport models."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from shared.agent.messages import Message
from shared.agent.spec import ModelProfile
from shared.llm.base import ModelRequest, ToolDef
from shared.llm.fake_server import FakeLLMServer
from shared.llm.openai_compat import OpenAICompatModel

# Recorded provider streams, kept in the repository (provenance in tests/fixtures/sse/INDEX.md).
SSE_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "sse"

SSE_HEADERS = {"content-type": "text/event-stream"}

Handler = Callable[[httpx.Request], httpx.Response]

CALC = ToolDef(
    name="calculator",
    description="Evaluate an arithmetic expression.",
    parameters={
        "type": "object",
        "properties": {"expression": {"type": "string"}},
        "required": ["expression"],
    },
)


def user(text: str) -> Message:
    return Message(role="user", content=text)


def request(*messages: Message, tools: tuple[ToolDef, ...] = (), **kw: Any) -> ModelRequest:
    return ModelRequest(messages=messages or (user("hi"),), tools=tools, **kw)


def profile(**kw: Any) -> ModelProfile:
    fields: dict[str, Any] = {"base_url": "http://model.test/v1", "model": "m"}
    fields.update(kw)
    return ModelProfile(**fields)


def mock_model(handler: Handler, **profile_kw: Any) -> OpenAICompatModel:
    client = httpx.Client(transport=httpx.MockTransport(handler))
    return OpenAICompatModel(profile(**profile_kw), client=client)


def sse_response(body: bytes, status: int = 200) -> httpx.Response:
    return httpx.Response(status, content=body, headers=SSE_HEADERS)


def fake_model(server: FakeLLMServer, **profile_kw: Any) -> OpenAICompatModel:
    fields: dict[str, Any] = {"base_url": server.base_url}
    fields.update(profile_kw)
    return OpenAICompatModel(profile(**fields))
