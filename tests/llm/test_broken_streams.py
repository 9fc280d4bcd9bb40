"""A stream that ends without ``[DONE]`` or a ``finish_reason`` is broken, never an answer
(SPEC M-2, M-8).

The server here ends its bodies by closing the connection (``tests.closing_llm``), so a
server dying mid-stream looks to the client like a stream that just ended. Every real
provider ends with ``[DONE]``, a ``finish_reason`` or both: each recorded stream still
assembles over such a server, and each one cut before its end is a ``BrokenStream``.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from shared.errors import BrokenStream, TransientModelError
from shared.llm.base import Delta
from shared.llm.fake_server import ReplySpec
from shared.llm.openai_compat import OpenAICompatModel
from tests.closing_llm import ClosingLLMServer

from .helpers import SSE_DIR, profile, request
from .test_sse_fixtures import EXPECTED, GOOD, _check


def _model(server: ClosingLLMServer) -> OpenAICompatModel:
    return OpenAICompatModel(profile(base_url=server.base_url))


@pytest.fixture
def closing() -> Any:
    with ClosingLLMServer() as server:
        yield server


def test_a_whole_reply_ends_by_closing_the_connection(closing: ClosingLLMServer) -> None:
    closing.script(ReplySpec(text="one two three"))
    reply = _model(closing).complete(request())
    assert reply.text == "one two three" and reply.finish_reason == "stop"


def test_a_server_dying_mid_stream_is_a_broken_stream(closing: ClosingLLMServer) -> None:
    # before: the partial text came back as the answer, with estimated usage
    closing.script(ReplySpec(text="one two three four five six", cut_after=3))
    deltas: list[Delta] = []
    with pytest.raises(BrokenStream, match=r"without \[DONE\] or a finish_reason") as info:
        _model(closing).complete(request(), deltas.append)
    assert isinstance(info.value, TransientModelError)  # retried by the round (M-8)
    assert deltas  # text had streamed: the provider bills it
    usage = info.value.usage
    assert usage is not None and usage["estimated"]
    assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0


def test_either_end_marker_alone_is_an_end(closing: ClosingLLMServer) -> None:
    closing.script(
        ReplySpec(text="finish, no [DONE]", done=False),  # Azure, Groq, Qwen do this
        ReplySpec(text="[DONE], no finish", finish_reason=None),  # Snowflake does this
    )
    model = _model(closing)
    assert model.complete(request()).text == "finish, no [DONE]"
    reply = model.complete(request())
    assert reply.text == "[DONE], no finish" and reply.finish_reason is None


def test_an_empty_body_is_a_broken_stream(closing: ClosingLLMServer) -> None:
    closing.script(ReplySpec(text="never sent", cut_after=0))
    with pytest.raises(BrokenStream):
        _model(closing).complete(request())


@pytest.mark.parametrize("name", GOOD)
def test_recorded_stream_over_a_closing_server(closing: ClosingLLMServer, name: str) -> None:
    closing.script(ReplySpec(raw=(SSE_DIR / name).read_bytes()))
    _check(_model(closing).complete(request()), EXPECTED[name])


_ENDS = re.compile(rb'"finish_reason"\s*:\s*"|\[DONE\]')


def _before_the_end(raw: bytes) -> bytes:
    """The recorded events before the first one that ends the stream."""
    kept = []
    for event in re.split(rb"\r?\n\r?\n", raw):
        if _ENDS.search(event):
            break
        kept.append(event + b"\n\n")
    return b"".join(kept)


@pytest.mark.parametrize("name", GOOD)
def test_recorded_stream_cut_before_its_end_is_broken(closing: ClosingLLMServer, name: str) -> None:
    cut = _before_the_end((SSE_DIR / name).read_bytes())
    assert b"[DONE]" not in cut
    closing.script(ReplySpec(raw=cut))
    with pytest.raises(BrokenStream):
        _model(closing).complete(request())
