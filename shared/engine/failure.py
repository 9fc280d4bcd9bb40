"""What a round or a tool call that raised becomes (L-12): retried, or the end of the run.

Every claim of a round counts an attempt in the database (``runs.attempts``; a tool call's
claim counts ``tool_calls.attempts``), and only the round's commit resets it, so a round that
keeps failing — an exception, a worker killed or OOM-killed in the middle — meets its bound
whatever the cause: a crash loop is impossible by construction. What raised is classified:

- **infrastructure** (the database or the broker unreachable): the system's fault, not the
  round's; the attempt is given back and the task's own retry (``worker.base``) or the
  reaper takes it up again;
- **fatal** (a spec or schema the engine cannot use, a programming error): retrying would
  fail the same way and bill the model again; the run fails at once with the cause;
- anything else: retried after a backoff, until the agent's ``max_attempts``; then the run
  fails with ``stop_reason: attempts_exhausted`` and the last cause. A failed run resumes
  (``POST /v1/runs/{id}/resume``, with a fixed spec if need be) with its attempts at 0.
"""

from __future__ import annotations

from typing import Any

from jsonschema.exceptions import SchemaError
from kombu.exceptions import OperationalError as BrokerError
from pydantic import ValidationError
from referencing.exceptions import Unresolvable
from sqlalchemy.exc import DBAPIError, OperationalError

from shared.errors import SpecError

__all__ = [
    "ATTEMPTS_EXHAUSTED",
    "ROUND_ERROR",
    "backoff",
    "describe",
    "fatal",
    "infrastructure",
]

ATTEMPTS_EXHAUSTED = "attempts_exhausted"  # the stop reason and error code: the bound was met
ROUND_ERROR = "round_error"  # a fatal error in a round: the error code
_MAX_MESSAGE = 500
_BACKOFF_CAP_S = 60.0

_FATAL: tuple[type[BaseException], ...] = (
    SpecError,
    SchemaError,
    Unresolvable,  # a schema's $ref that points at nothing
    ValidationError,  # a stored spec or state the code no longer reads
    TypeError,
    AttributeError,
    NameError,
    ImportError,
    AssertionError,
    NotImplementedError,
    RecursionError,
)


def infrastructure(exc: BaseException) -> bool:
    """The database or the broker could not be reached: not the round's fault."""
    if isinstance(exc, OperationalError | BrokerError):
        return True
    return isinstance(exc, DBAPIError) and bool(exc.connection_invalidated)


def fatal(exc: BaseException) -> bool:
    """Retrying would fail the same way (and bill the model again)."""
    return isinstance(exc, _FATAL)


def describe(exc: BaseException, attempt: int, ts: float) -> dict[str, Any]:
    """The run's ``last_error``: what raised, at which attempt, when."""
    message = str(exc) or type(exc).__name__
    return {
        "type": type(exc).__name__,
        "message": message[:_MAX_MESSAGE],
        "attempt": attempt,
        "failed_at": ts,
    }


def backoff(attempt: int) -> float:
    """Seconds before the next attempt after ``attempt`` failed: 1, 2, 4 … 60."""
    return min(_BACKOFF_CAP_S, 2.0 ** max(0, attempt - 1))
