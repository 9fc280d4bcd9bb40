"""Fixtures for the model-client tests: learnt tool modes reset, one fake server a module."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from shared.llm.fake_server import FakeLLMServer


@pytest.fixture(scope="module")
def _server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as server:
        yield server


@pytest.fixture
def fake(_server: FakeLLMServer) -> FakeLLMServer:
    deadline = time.monotonic() + 3.0
    while _server.state.in_flight and time.monotonic() < deadline:
        time.sleep(0.02)  # the test before's replies end (and their disconnects land) first
    _server.reset()
    return _server
