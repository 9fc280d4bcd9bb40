"""The ambient values of the task a thread works on, each a ``ContextVar`` (as Hatchet's
``contextvars.py``): set by a ``with`` block, seen by everything the block calls, copied into
the threads it starts with ``contextvars.copy_context()``. The only module-level state that
changes as the process works; everything else a process holds is on its runtime
(``shared.engine.runtime.Runtime``).

- ``LOG_FIELDS``: the fields every log record of the block carries (run_id, round, call_id,
  task) — ``shared.logs.log_context``;
- ``WORKING_FOR``: the ``Abort`` handle the block's blocking I/O answers to (a model call, a
  tool) — ``shared.llm.abort.Abort.bound``.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any, Final

__all__ = ["LOG_FIELDS", "WORKING_FOR"]

LOG_FIELDS: Final[ContextVar[dict[str, Any] | None]] = ContextVar("treadle_log", default=None)
WORKING_FOR: Final[ContextVar[Any]] = ContextVar("treadle_abort", default=None)
