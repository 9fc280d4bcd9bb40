"""A commit that found a row held elsewhere (PostgreSQL ``lock_timeout``) is tried again a
few times when the work it commits is expensive to redo (a model reply, a tool's result):
the wait stays bounded (tries x lock_timeout), and past it the error goes up as any other
(the task is dropped, the lease given back, the work re-driven)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.exc import OperationalError

from shared.store.db import lock_busy

__all__ = ["COMMIT_TRIES", "when_free"]

log = logging.getLogger("treadle.transition")
COMMIT_TRIES = 3
T = TypeVar("T")


def when_free(op: Callable[[], T], what: str, tries: int = COMMIT_TRIES) -> T:
    for n in range(1, tries + 1):
        try:
            return op()
        except OperationalError as exc:
            if not lock_busy(exc) or n == tries:
                raise
            log.info("%s: a row is held elsewhere; trying again (%d of %d)", what, n, tries)
    raise AssertionError("unreachable")
