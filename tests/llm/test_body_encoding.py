"""The model request's body is encoded by orjson: the JSON httpx's ``json=`` would send, byte for
byte but for how a float may be spelled (``1e-7`` for ``1e-07``)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.llm.openai_compat import encode_body


def _httpx(body: dict[str, Any]) -> bytes:
    return httpx.Request("POST", "http://x/", json=body).content


BODIES = [
    {"model": "m", "messages": [{"role": "user", "content": 'héllo – 你好 \u2028 \x00 "q" \\'}]},
    {"model": "m", "stream": True, "max_tokens": 5, "temperature": 0.1, "top_p": 0.95},
    {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"a": [1, 2.5]}}}]},
    {"nested": {"a": {"b": {"c": [None, True, False, -0.0, 1e300]}}}},
]


@pytest.mark.parametrize("body", BODIES)
def test_the_body_is_what_httpx_would_send(body: dict[str, Any]) -> None:
    assert encode_body(body) == _httpx(body)


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(exclude_categories=["Cs"])),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=8), JSON, max_size=6))
def test_any_json_body_reads_back_the_same(body: dict[str, Any]) -> None:
    assert json.loads(encode_body(body)) == json.loads(_httpx(body))


def test_a_float_may_be_spelled_otherwise_and_reads_the_same() -> None:
    body = {"top_p": 1e-07}
    assert encode_body(body) == b'{"top_p":1e-7}' and _httpx(body) == b'{"top_p":1e-07}'


def test_what_orjson_refuses_goes_through_the_standard_library() -> None:
    body = {"seed": 2**70, "messages": []}
    assert encode_body(body) == _httpx(body)
