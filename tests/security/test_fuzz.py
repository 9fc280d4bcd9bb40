"""Schemathesis against the API's own /openapi.json, with **every** check: an admin key, auth
required, on SQLite and the stub broker. Valid and invalid (negative) requests; no 5xx,
responses as documented (status codes, content types, headers, bodies), every schema-valid
request accepted (``positive_data_acceptance``), every schema-violating one rejected
(``negative_data_rejection``), requests without a key refused. Any finding fails the test
(and CI). A summary line is printed at the end.

Bounded: ``MAX_EXAMPLES`` per operation (``TREADLE_FUZZ_EXAMPLES`` overrides), derandomized so
CI runs the same cases every time. Two kinds of generated request are not sent, each because
no schema can say it, not to hide a finding:

* a message list whose last message is not the user's (the engine's rule; the schema states
  it in the description, JSON Schema cannot address an array's last item);
* an agent spec whose tools repeat a name (JSON Schema's ``uniqueItems`` compares whole items,
  not a registered tool's name with an inline tool's);
* a cron schedule that matches the schema's pattern but names no time at all or a reversed
  range (``0 0 31 2 *``, ``5-3 * * * *``): a regular expression cannot compare numbers;
* a negative multipart body whose violation is a JSON type (``null``, a number for a file):
  on the wire every part is bytes, so ``null`` arrives as a valid 4-byte file.

Left out: ``max_response_time`` (a loaded CI machine is not a schema finding).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import schemathesis
from hypothesis import HealthCheck
from schemathesis.checks import max_response_time

from scheduler.app import create_app
from shared.config import Settings
from shared.engine import schedule
from shared.engine.runtime import Dispatch, Runtime
from shared.engine.testing import StubBroker
from shared.errors import SpecError
from shared.store import keys
from shared.store.db import make_engine, migrate
from tests.support import FUZZ_TALLY_ENV

MAX_EXAMPLES = int(os.environ.get("TREADLE_FUZZ_EXAMPLES", "30"))
_RT: list[Runtime] = []
LAST_MESSAGE_IS_USERS = {  # operation → where its input messages are in the body
    "POST /v1/runs": ("input",),
    "POST /openai/v1/responses": ("input",),
    **{
        f"POST /langgraph{path}": ("input", "messages")
        for path in (
            "/runs",
            "/runs/stream",
            "/runs/wait",
            "/threads/{thread_id}/runs",
            "/threads/{thread_id}/runs/stream",
            "/threads/{thread_id}/runs/wait",
        )
    },
}
_USER_ROLES = frozenset({"user", "human"})
_TALLY: Counter[str] = Counter()
_OPERATIONS: set[str] = set()
app = create_app(lambda: _RT[0], auth="required")
schema = schemathesis.openapi.from_asgi("/openapi.json", app)


class _DrivingBroker(StubBroker):
    """Runs what is published in a background thread (the engine's own functions, as a worker
    would), so a route that waits for a run's end (``/runs/wait``, a non-streamed response)
    gets one instead of hanging on a broker nobody reads."""

    def __call__(self, items: list[Dispatch]) -> None:
        super().__call__(items)
        threading.Thread(target=self._drain_quietly, daemon=True).start()

    def _drain_quietly(self) -> None:
        with contextlib.suppress(Exception):
            self.drain(_RT[0])


@pytest.fixture(scope="module")
def api_key() -> Iterator[str]:
    """One SQLite runtime for the module; an admin key (every scope) of tenant ``fuzz``."""
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'fuzz.db'}"
        engine = make_engine(url)
        migrate(engine)
        settings = Settings(database_url=url, broker_url="memory://", auth="required")
        _RT[:] = [Runtime(engine=engine, settings=settings, publish=_DrivingBroker())]
        with engine.begin() as conn:
            secret = keys.create_key(conn, "fuzz", [keys.ADMIN]).secret
        started = time.monotonic()
        yield secret
        _TALLY["seconds"] = int(time.monotonic() - started)
        _save_tally()
        engine.dispose()
        _RT.clear()


def _save_tally() -> None:
    """This process's figures, for the summary line the session prints (tests/conftest.py; with
    ``-n 2`` each xdist worker fuzzes part of the operations)."""
    folder = os.environ.get(FUZZ_TALLY_ENV)
    if folder and _TALLY["cases"]:
        tally = {**_TALLY, "operations": sorted(_OPERATIONS)}
        name = os.environ.get("PYTEST_XDIST_WORKER", "main")
        Path(folder, f"{name}.json").write_text(json.dumps(tally))


def _role(message: Any) -> Any:
    if isinstance(message, str):
        return "user"
    if not isinstance(message, dict):
        return None
    return message.get("role") or message.get("type")


def _tool_names_repeat(spec: Any) -> bool:
    """Does an agent spec (or an agent tool's, at any depth) name a tool twice?"""
    if not isinstance(spec, dict) or not isinstance(spec.get("tools"), list):
        return False
    tools = spec["tools"]
    names = [t if isinstance(t, str) else t.get("name") for t in tools if isinstance(t, str | dict)]
    nested = (t.get("agent") for t in tools if isinstance(t, dict))
    return len(names) != len(set(names)) or any(_tool_names_repeat(a) for a in nested)


CRON_OPERATIONS = frozenset(
    {
        "POST /v1/crons",
        "POST /langgraph/runs/crons",
        "POST /langgraph/threads/{thread_id}/runs/crons",
    }
)


def _impossible_schedule(label: str, body: Any) -> bool:
    """A pattern-valid cron expression with no slot or a reversed range (see the module doc).
    Checked in ``filter_body`` and again before a call (the coverage phase's bodies do not pass
    through the filter)."""
    if label not in CRON_OPERATIONS or not isinstance(body, dict):
        return False
    value = body.get("schedule")
    if not isinstance(value, str) or not re.match(schedule.CRON_PATTERN, value):
        return False
    try:
        schedule.check_schedule(value, "UTC")
    except SpecError:
        return True
    return False


def filter_body(ctx: Any, body: Any) -> bool:
    """Not sent: a message list whose last message is not the user's (OpenAI: of its
    ``message`` items); an agent spec that names a tool twice; an impossible schedule."""
    if _impossible_schedule(ctx.operation.label, body):
        return False
    if isinstance(body, dict) and _tool_names_repeat(body.get("agent")):
        return False
    path = LAST_MESSAGE_IS_USERS.get(ctx.operation.label)
    value = body
    for key in path or ():
        value = value.get(key) if isinstance(value, dict) else None
    if path is None or not isinstance(value, list):
        return True
    if path == ("input",) and ctx.operation.label.startswith("POST /openai"):
        value = [m for m in value if isinstance(m, dict) and m.get("type", "message") == "message"]
    return not value or _role(value[-1]) in _USER_ROLES


def _wire_blind(case: Any) -> bool:
    """A negative multipart body whose only fault is a JSON type (see the module doc)."""
    meta = case.meta
    if meta is None or not meta.generation.mode.is_negative:
        return False
    description = str(getattr(meta.phase.data, "description", "") or "")
    return (case.media_type or "").startswith("multipart/") and "violates `type`" in description


@schema.hooks.apply(filter_body)
@schema.parametrize()
@hypothesis.settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_api(case: Any, api_key: str) -> None:
    _OPERATIONS.add(case.operation.label)
    if _wire_blind(case):
        _TALLY["wire_blind"] += 1
        return
    if _impossible_schedule(case.operation.label, case.body):
        _TALLY["no_slot"] += 1
        return
    _TALLY["cases"] += 1
    excluded = [max_response_time]
    try:
        response = case.call_and_validate(
            headers={"Authorization": f"Bearer {api_key}"}, excluded_checks=excluded
        )
    except BaseException:  # schemathesis' FailureGroup is a BaseExceptionGroup
        _TALLY["failures"] += 1
        raise
    _TALLY["rejected"] += 400 <= response.status_code < 500
    _TALLY["5xx"] += response.status_code >= 500
