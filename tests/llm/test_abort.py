"""Abort handles (``shared.llm.abort``): a model call ends at its deadline or on ``cancel()``
within a fraction of a second, whatever the server does: a stream gone silent, no first byte,
a scripted sleep. Real sockets (the fake server), real threads."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from shared.agent.spec import ModelProfile
from shared.errors import Aborted, CallCancelled, DeadlineExceeded, TransientModelError
from shared.llm.abort import WATCH_INTERVAL_S, Abort
from shared.llm.fake_server import FakeLLMServer, ReplySpec
from shared.llm.profiles import http_client, make_model
from shared.llm.scripted import ScriptedModel
from tests.llm.helpers import fake_model, request

SLACK_S = 0.6  # a loaded 2-core machine: the watchdog ticks every 0.1 s


def _timed(fn: Callable[[], object]) -> tuple[BaseException | None, float]:
    started = time.monotonic()
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - the test inspects it
        return exc, time.monotonic() - started
    return None, time.monotonic() - started


def _cancel_after(abort: Abort, seconds: float) -> None:
    timer = threading.Timer(seconds, abort.cancel)
    timer.daemon = True
    timer.start()


def test_a_silent_stream_ends_at_the_deadline(fake: FakeLLMServer) -> None:
    fake.script(ReplySpec(text="one two three", chunk_bytes=8, hang=30))
    model = fake_model(fake)
    abort = Abort(deadline_at=time.time() + 0.8)
    exc, took = _timed(lambda: model.complete(request(), abort=abort))
    assert isinstance(exc, DeadlineExceeded), exc
    assert 0.8 <= took < 0.8 + SLACK_S


def test_cancel_closes_a_silent_stream_at_once(fake: FakeLLMServer) -> None:
    fake.script(ReplySpec(text="one two three", chunk_bytes=8, hang=30))
    model = fake_model(fake)
    abort = Abort()  # no deadline: cancel() alone
    _cancel_after(abort, 0.5)
    exc, took = _timed(lambda: model.complete(request(), abort=abort))
    assert isinstance(exc, CallCancelled), exc
    assert 0.5 <= took < 0.5 + SLACK_S
    # the server saw the connection closed (what a provider needs to stop generating)
    started = time.time() - took
    closed = _wait(lambda: [t for t in fake.disconnects if t >= started + 0.4])  # this call's
    assert len(closed) == 1 and closed[0] - started < 0.5 + SLACK_S


def _wait(fn: Callable[[], list[float]], seconds: float = 3.0) -> list[float]:
    end = time.monotonic() + seconds
    while not fn() and time.monotonic() < end:
        time.sleep(0.02)
    return fn()


def test_a_reply_sent_in_full_is_no_disconnect(fake: FakeLLMServer) -> None:
    fake.script(ReplySpec(text="one two three"))
    fake_model(fake).complete(request())
    time.sleep(0.2)
    assert fake.disconnects == []


@pytest.mark.parametrize("stream", [True, False])
def test_cancel_ends_a_wait_for_the_first_byte(fake: FakeLLMServer, stream: bool) -> None:
    fake.script(ReplySpec(text="late", first_byte_latency=30))
    model = fake_model(fake, stream=stream)
    abort = Abort(deadline_at=time.time() + 60)
    _cancel_after(abort, 0.5)
    exc, took = _timed(lambda: model.complete(request(), abort=abort))
    assert isinstance(exc, CallCancelled), exc
    assert took < 0.5 + SLACK_S


def test_the_shared_client_is_abortable_and_works_after_an_abort(fake: FakeLLMServer) -> None:
    profile = ModelProfile(base_url=fake.base_url, model="m").as_operator()
    fake.script(ReplySpec(text="x", hang=30), ReplySpec(text="fine"))
    model = make_model(profile)
    exc, took = _timed(lambda: model.complete(request(), abort=Abort(time.time() + 0.5)))
    assert isinstance(exc, DeadlineExceeded) and took < 0.5 + SLACK_S
    assert make_model(profile).complete(request(), abort=Abort(time.time() + 10)).text == "fine"
    assert make_model(profile).complete(request()).text.startswith("echo")  # no handle at all
    http_client(fake.base_url).close()


def test_without_a_handle_a_stall_is_an_ordinary_timeout(fake: FakeLLMServer) -> None:
    fake.script(ReplySpec(text="x", hang=30))
    with pytest.raises(TransientModelError):
        fake_model(fake, timeout_read=0.3).complete(request())


def test_a_scripted_sleep_is_interrupted() -> None:
    model = ScriptedModel([{"sleep": 40, "text": "late"}])
    exc, took = _timed(lambda: model.complete(request(), abort=Abort(time.time() + 0.3)))
    assert isinstance(exc, DeadlineExceeded) and took < 0.3 + SLACK_S
    abort = Abort()
    _cancel_after(abort, 0.2)
    exc, took = _timed(lambda: model.complete(request(), abort=abort))
    assert isinstance(exc, CallCancelled) and took < 0.2 + SLACK_S


def test_the_handle_fires_once_and_runs_its_closers() -> None:
    abort = Abort(deadline_at=time.time() + 0.2)
    closed: list[float] = []
    with abort.closing(lambda: closed.append(time.monotonic())):
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            abort.wait(10)
        time.sleep(WATCH_INTERVAL_S * 3)
    assert len(closed) == 1 and closed[0] - started < 0.2 + SLACK_S
    abort.cancel()  # too late: it stays a deadline
    assert isinstance(abort.error(), DeadlineExceeded)
    late = Abort()
    late.cancel("run cancelled")
    with pytest.raises(CallCancelled, match="run cancelled"):
        late.check()
    ran: list[int] = []
    with late.closing(lambda: ran.append(1)):  # already fired: the closer runs at once
        pass
    assert ran == [1] and issubclass(CallCancelled, Aborted)
