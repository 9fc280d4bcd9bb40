"""SPEC M-8: HTTP statuses and transport failures → typed errors with the provider message.

Error bodies are the kit's real recordings in fixtures/sse/errors/ (statuses per INDEX.md).
"""

from __future__ import annotations

import httpx
import pytest

from shared.errors import FatalModelError, ModelError, ToolsRejected, TransientModelError
from shared.llm.stream import provider_message

from .helpers import CALC, SSE_DIR, mock_model, request

ERRORS_DIR = SSE_DIR / "errors"

# file → (status, the provider's words that must reach the error message)
RECORDED = {
    "openai_400_web_search_options_not_supported.json": (
        400,
        "Web search options not supported with this model.",
    ),
    "openai_400_system_role_unsupported_o1_mini.json": (
        400,
        "Unsupported value: 'messages[0].role' does not support 'system' with this model.",
    ),
    "groq_400_tool_use_failed.json": (400, "Tool call validation failed"),
    "openrouter_429_upstream_rate_limited.json": (
        429,
        "is temporarily rate-limited upstream",  # metadata.raw explains "Provider returned error"
    ),
    "ollama_400_tools_not_supported_openai_compat.json": (
        400,
        "registry.ollama.ai/library/gemma3:4b does not support tools",
    ),
    "ollama_400_tools_not_supported_native_api.json": (
        400,
        "registry.ollama.ai/library/Qwen3.5:0.8b does not support tools",
    ),
    "azure_429_message_retry_after_33s.txt": (429, "Please retry after 33 seconds"),
}


def test_every_recorded_error_body_is_covered() -> None:
    assert {p.name for p in ERRORS_DIR.iterdir()} == set(RECORDED)


def _error_for(name: str, *, tools: bool = False, headers: dict[str, str] | None = None):
    status, _ = RECORDED[name]
    body = (ERRORS_DIR / name).read_bytes()
    ctype = "application/json" if name.endswith(".json") else "text/plain"

    def handler(_: httpx.Request) -> httpx.Response:
        return httpx.Response(
            status, content=body, headers={"content-type": ctype, **(headers or {})}
        )

    model = mock_model(handler, tool_mode="native")
    req = request(tools=(CALC,)) if tools else request()
    with pytest.raises(ModelError) as info:
        model.complete(req)
    return info.value


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_recorded_error_bodies_map_to_typed_errors(name: str) -> None:
    # SPEC M-8: 429 transient; other 4xx fatal, with the provider's message
    status, words = RECORDED[name]
    err = _error_for(name)
    assert err.status == status
    assert words in str(err)
    expected = TransientModelError if status == 429 else FatalModelError
    assert type(err) is expected


def test_azure_retry_after_from_the_message_text() -> None:
    # SPEC M-8: no Retry-After header recorded; the message says 33 seconds
    assert _error_for("azure_429_message_retry_after_33s.txt").retry_after == 33.0


def test_retry_after_header_wins_over_message() -> None:
    err = _error_for("azure_429_message_retry_after_33s.txt", headers={"Retry-After": "5"})
    assert err.retry_after == 5.0


@pytest.mark.parametrize(
    "name", ["ollama_400_tools_not_supported_openai_compat.json", "groq_400_tool_use_failed.json"]
)
def test_400_to_a_request_with_tools_is_tools_rejected(name: str) -> None:
    # SPEC M-8/M-6: ToolsRejected (a FatalModelError) after the resend also failed
    err = _error_for(name, tools=True)
    assert isinstance(err, ToolsRejected) and isinstance(err, FatalModelError)
    assert RECORDED[name][1] in str(err)


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (401, FatalModelError),
        (403, FatalModelError),
        (404, FatalModelError),
        (422, FatalModelError),
        (408, TransientModelError),
        (429, TransientModelError),
        (500, TransientModelError),
        (502, TransientModelError),
        (503, TransientModelError),
        (529, TransientModelError),
    ],
)
def test_status_classes(status: int, kind: type[ModelError]) -> None:
    # SPEC M-8
    def handler(_: httpx.Request) -> httpx.Response:
        return httpx.Response(status, json={"error": {"message": f"status {status}"}})

    with pytest.raises(kind, match=f"status {status}") as info:
        mock_model(handler).complete(request())
    assert info.value.status == status


@pytest.mark.parametrize(
    "exc",
    [
        httpx.ConnectTimeout("connect"),
        httpx.ReadTimeout("read"),
        httpx.ConnectError("refused"),
        httpx.RemoteProtocolError("peer closed connection"),
        httpx.ReadError("reset"),
    ],
)
def test_transport_failures_are_transient(exc: Exception) -> None:
    # SPEC M-8: connect/read timeouts and broken streams
    def handler(_: httpx.Request) -> httpx.Response:
        raise exc

    with pytest.raises(TransientModelError) as info:
        mock_model(handler).complete(request())
    assert info.value.__cause__ is exc


def test_stream_broken_after_some_chunks_is_transient() -> None:
    # SPEC M-8: a broken stream mid-way (the fake server test covers a real cut socket)
    def body():
        yield b'data: {"choices":[{"index":0,"delta":{"content":"par"}}]}\n\n'
        raise httpx.RemoteProtocolError("incomplete chunked read")

    def handler(_: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body(), headers={"content-type": "text/event-stream"})

    with pytest.raises(TransientModelError, match="RemoteProtocolError"):
        mock_model(handler).complete(request())


def test_malformed_chunk_is_a_broken_stream() -> None:
    def handler(_: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, content=b"data: {not json\n\n", headers={"content-type": "text/event-stream"}
        )

    with pytest.raises(TransientModelError, match="malformed"):
        mock_model(handler).complete(request())


def test_event_error_with_plain_text_data() -> None:
    # SPEC M-2: `event: error` is an error even when its data is not JSON
    def handler(_: httpx.Request) -> httpx.Response:
        body = b'data: {"choices":[]}\n\nevent: error\ndata: upstream exploded\n\n'
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    with pytest.raises(FatalModelError, match="upstream exploded"):
        mock_model(handler).complete(request())


def test_200_with_unexpected_content_type_is_fatal() -> None:
    def handler(_: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, content=b"<html>login</html>", headers={"content-type": "text/html"}
        )

    with pytest.raises(FatalModelError, match="content-type"):
        mock_model(handler).complete(request())


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"error": {"message": "m", "type": "t"}}, "m"),
        ({"error": "plain"}, "plain"),
        ([{"error": {"message": "gemini", "code": 400}}], "gemini"),
        ({"detail": "fastapi"}, "fastapi"),
        ({"message": "top"}, "top"),
        ("  text body  ", "text body"),
        (
            {
                "error": {
                    "code": 429,
                    "message": "Provider returned error",
                    "metadata": {"raw": "why"},
                }
            },
            "Provider returned error: why",
        ),
    ],
)
def test_provider_message_shapes(body: object, message: str) -> None:
    assert provider_message(body) == message


def test_long_messages_are_clipped() -> None:
    assert len(provider_message({"error": "x" * 10_000})) < 2100


def test_error_json_is_not_mistaken_for_a_reply() -> None:
    # a 200 JSON body that is an error object (some gateways) raises too
    def handler(_: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"error": {"message": "quota", "code": 429}})

    with pytest.raises(TransientModelError, match="quota"):
        mock_model(handler, stream=False).complete(request())


def test_a_huge_retry_after_is_capped() -> None:
    """A provider (a tenant's own server, maybe) does not choose how long a profile pauses."""
    err = _error_for("azure_429_message_retry_after_33s.txt", headers={"Retry-After": "120"})
    assert err.retry_after == 60.0
    assert (
        _error_for(
            "azure_429_message_retry_after_33s.txt", headers={"Retry-After": "86400"}
        ).retry_after
        == 60.0
    )
