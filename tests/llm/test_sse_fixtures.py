"""Every recorded stream in the kit's fixtures/sse/ through the real client (SPEC M-2).

The bytes go unchanged through ``httpx.MockTransport`` into ``OpenAICompatModel``, and the
reply is compared with EXPECTED.json. A property test re-chunks the streams at random byte
boundaries; the reply must not change.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.agent.messages import Reply
from shared.errors import FatalModelError, ModelError
from shared.llm.base import Delta

from .helpers import SSE_DIR, SSE_HEADERS, mock_model, request

EXPECTED: dict[str, Any] = json.loads((SSE_DIR / "EXPECTED.json").read_text(encoding="utf-8"))
STREAMS = sorted(p.name for p in SSE_DIR.glob("*.txt"))
ERRORS = sorted(name for name in STREAMS if EXPECTED[name]["errors"])
GOOD = sorted(name for name in STREAMS if not EXPECTED[name]["errors"])


def _body(name: str) -> bytes:
    return (SSE_DIR / name).read_bytes()


def _run(body_parts: list[bytes], on_delta: Any = None) -> Reply:
    def handler(_: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=iter(body_parts), headers=SSE_HEADERS)

    return mock_model(handler).complete(request(), on_delta)


def _check(reply: Reply, expected: dict[str, Any]) -> None:
    assert reply.text == expected["content"]
    assert reply.reasoning == expected["reasoning"]
    assert [(c.id, c.name, c.arguments) for c in reply.tool_calls] == [
        (c["id"], c["name"], c["arguments"]) for c in expected["tool_calls"]
    ]
    assert reply.finish_reason == expected["finish_reason"]
    usage = expected["usage"]
    assert reply.usage is not None
    if usage is None:
        assert reply.usage.estimated  # SPEC M-9: missing usage is estimated and marked
    else:
        assert not reply.usage.estimated
        assert reply.usage.input_tokens == usage["prompt_tokens"]
        assert reply.usage.output_tokens == usage["completion_tokens"]
        total = reply.usage.input_tokens + reply.usage.output_tokens
        assert total == usage["total_tokens"]


def test_the_kit_holds_17_streams() -> None:
    assert len(STREAMS) == 17 and set(STREAMS) == set(EXPECTED)
    for name in STREAMS:  # bytes unchanged
        assert hashlib.sha256(_body(name)).hexdigest() == EXPECTED[name]["sha256"]


@pytest.mark.parametrize("name", GOOD)
def test_recorded_stream_assembles_as_expected(name: str) -> None:
    # SPEC M-2, M-3, M-4
    deltas: list[Delta] = []
    reply = _run([_body(name)], deltas.append)
    _check(reply, EXPECTED[name])
    streamed = "".join(d.text for d in deltas if d.kind == "text")
    assert streamed == EXPECTED[name]["content"]


@pytest.mark.parametrize("name", ERRORS)
def test_recorded_error_stream_raises_typed_error(name: str) -> None:
    # SPEC M-2: an error chunk or `event: error` is an error, never an empty success
    with pytest.raises(ModelError) as info:
        _run([_body(name)])
    error = EXPECTED[name]["errors"][0]
    assert isinstance(info.value, FatalModelError)  # both carry a 400
    assert info.value.status == 400
    assert error["message"] in str(info.value)


@pytest.mark.parametrize("name", GOOD)
def test_data_without_space(name: str) -> None:
    # SPEC M-2 — synthesized from the real file: "data:{...}" (INDEX.md: not found recorded)
    body = _body(name).replace(b"data: ", b"data:")
    _check(_run([body]), EXPECTED[name])


def test_crlf_line_endings() -> None:
    # SPEC M-2 — synthesized: CRLF framing, plus id:/retry: fields that must be ignored
    name = "openai_gpt4o_tool_args_split.txt"
    body = b"retry: 1000\nid: 7\n\n" + _body(name).replace(b"\n", b"\r\n")
    _check(_run([body]), EXPECTED[name])


def _split(body: bytes, cuts: list[int]) -> Iterator[bytes]:
    last = 0
    for cut in sorted({c % (len(body) + 1) for c in cuts}):
        yield body[last:cut]
        last = cut
    yield body[last:]


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
@given(
    name=st.sampled_from(GOOD),
    cuts=st.lists(st.integers(min_value=0, max_value=40_000), max_size=40),
)
def test_any_rechunking_assembles_the_same_reply(name: str, cuts: list[int]) -> None:
    # SPEC M-2/M-4 property: byte boundaries (even inside UTF-8 characters) do not matter
    parts = [p for p in _split(_body(name), cuts) if p]
    _check(_run(parts), EXPECTED[name])


@settings(max_examples=15, deadline=None, derandomize=True)
@given(name=st.sampled_from(ERRORS), size=st.integers(min_value=1, max_value=64))
def test_error_streams_raise_under_any_chunking(name: str, size: int) -> None:
    body = _body(name)
    parts = [body[i : i + size] for i in range(0, len(body), size)]
    with pytest.raises(FatalModelError):
        _run(parts)
