"""Schemathesis against the API's own /openapi.json (issue #11, acceptance 2): every operation,
with an API key, on SQLite and the stub broker. Valid and invalid (negative) requests; no 5xx,
responses as documented (status codes, content types, headers, bodies), invalid requests
rejected, requests without a key refused. A summary line is printed at the end.

Bounded: ``MAX_EXAMPLES`` per operation (``TREADLE_FUZZ_EXAMPLES`` overrides), derandomized so
CI runs the same cases every time.

Left out: ``positive_data_acceptance`` (a schema-valid spec can still name an unknown model
profile or tool: a 422 from the domain, not a schema bug), ``max_response_time``, and the
checks ``KNOWN_ISSUES`` names for one operation each (each with its reason).
"""

from __future__ import annotations

import os
import tempfile
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
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance

from scheduler.api import create_app
from shared.config import Settings
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.store import keys
from shared.store.db import make_engine, migrate

MAX_EXAMPLES = int(os.environ.get("TREADLE_FUZZ_EXAMPLES", "25"))
_RT: list[Runtime] = []
KNOWN_ISSUES: dict[str, list[Any]] = {
    # multipart fields are text on the wire: a "negative" number or boolean for `name` or
    # `file` arrives as valid text, and schemathesis flags the 201 (a false positive)
    "POST /v1/files": [negative_data_rejection],
    # interop facade (issue #16, not this suite's code): `limit`/`offset` take JSON booleans
    # (pydantic lax ints); remove once its body model is strict
    "POST /langgraph/threads/search": [negative_data_rejection],
}
_TALLY: Counter[str] = Counter()
_OPERATIONS: set[str] = set()
app = create_app(lambda: _RT[0], auth="required")
schema = schemathesis.openapi.from_asgi("/openapi.json", app)


@pytest.fixture(scope="module")
def api_key() -> Iterator[str]:
    """One SQLite runtime for the module; an admin key (every scope) of tenant ``fuzz``."""
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'fuzz.db'}"
        engine = make_engine(url)
        migrate(engine)
        settings = Settings(database_url=url, broker_url="memory://", auth="required")
        _RT[:] = [Runtime(engine=engine, settings=settings, publish=StubBroker())]
        with engine.begin() as conn:
            secret = keys.create_key(conn, "fuzz", [keys.ADMIN]).secret
        started = time.monotonic()
        yield secret
        _TALLY["seconds"] = int(time.monotonic() - started)
        engine.dispose()
        _RT.clear()


def summary_line() -> str | None:
    """The run's figures (printed in pytest's terminal summary by tests/security/conftest)."""
    if not _TALLY["cases"]:
        return None
    return (f"schemathesis: {len(_OPERATIONS)} operations, {_TALLY['cases']} cases "
            f"({_TALLY['rejected']} rejected with 4xx), {_TALLY['5xx']} server errors, "
            f"{_TALLY['failures']} failed checks, {_TALLY['seconds']}s")


@schema.parametrize()
@hypothesis.settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
                     suppress_health_check=list(HealthCheck))
def test_api(case: Any, api_key: str) -> None:
    _OPERATIONS.add(case.operation.label)
    _TALLY["cases"] += 1
    excluded = [positive_data_acceptance, max_response_time,
                *KNOWN_ISSUES.get(case.operation.label, ())]
    try:
        response = case.call_and_validate(headers={"Authorization": f"Bearer {api_key}"},
                                          excluded_checks=excluded)
    except BaseException:  # schemathesis' FailureGroup is a BaseExceptionGroup
        _TALLY["failures"] += 1
        raise
    _TALLY["rejected"] += 400 <= response.status_code < 500
    _TALLY["5xx"] += response.status_code >= 500
