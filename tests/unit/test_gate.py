"""The engine gate (``shared.engine.gate``): at most ``slots`` threads inside, the line served
by stage (a round's later stage first) then by arrival, re-entrant, and ``outside`` lets the
slot go for a wait and comes back in."""

from __future__ import annotations

import threading
import time

from shared.engine.gate import Gate, Stage


def _until(pred: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_no_slots_is_no_gate() -> None:
    gate = Gate(0)
    with gate.inside(Stage.CLAIM), gate.inside(Stage.TOOL), gate.outside(Stage.REPLY):
        pass
    assert gate.waiting() == 0


def test_at_most_slots_inside() -> None:
    gate, inside, peak, lock = Gate(2), [0], [0], threading.Lock()

    def work() -> None:
        with gate.inside(Stage.TOOL):
            with lock:
                inside[0] += 1
                peak[0] = max(peak[0], inside[0])
            time.sleep(0.01)
            with lock:
                inside[0] -= 1

    threads = [threading.Thread(target=work) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert peak[0] == 2


def test_the_line_serves_later_stages_first_then_arrival() -> None:
    gate, order = Gate(1), []
    release = threading.Event()

    def holder() -> None:
        with gate.inside(Stage.REPLY):
            release.wait(5)

    def waiter(stage: Stage, tag: str) -> None:
        with gate.inside(stage):
            order.append(tag)

    first = threading.Thread(target=holder)
    first.start()
    _until(lambda: gate.free() == 0)
    waiters = []
    for stage, tag in [
        (Stage.REPLY, "reply-1"),
        (Stage.TOOL, "tool"),
        (Stage.REPLY, "reply-2"),
        (Stage.CLAIM, "claim"),
    ]:
        t = threading.Thread(target=waiter, args=(stage, tag))
        t.start()
        waiters.append(t)
        _until(lambda n=len(waiters): gate.waiting() == n)
    release.set()
    for t in [first, *waiters]:
        t.join(5)
    assert order == ["claim", "tool", "reply-1", "reply-2"]


def test_inside_is_reentrant_and_outside_lets_the_slot_go() -> None:
    gate = Gate(1)
    other_in = threading.Event()

    def other() -> None:
        with gate.inside(Stage.TOOL):
            other_in.set()

    with gate.inside(Stage.CLAIM):
        with gate.inside(Stage.CLAIM):  # re-entrant: no second slot, no deadlock
            pass
        t = threading.Thread(target=other)
        t.start()
        assert not other_in.wait(0.1)  # the one slot is held
        with gate.outside(Stage.REPLY):  # a model call: the slot goes to the line
            assert other_in.wait(5)
            t.join(5)
        assert gate.free() == 0  # back inside
    assert gate.free() == 1 and gate.waiting() == 0


def test_outside_without_inside_is_a_no_op() -> None:
    gate = Gate(1)
    with gate.outside(Stage.REPLY):
        assert gate.free() == 1
    assert gate.free() == 1


def test_an_error_inside_gives_the_slot_back() -> None:
    gate = Gate(1)
    try:
        with gate.inside(Stage.TOOL):
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    with gate.inside(Stage.TOOL):
        assert gate.free() == 0
    assert gate.free() == 1
