"""/metrics exposes the operations series, and they move when runs execute."""

from __future__ import annotations

import json
import logging
import re

from fastapi.testclient import TestClient

from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.logs import JsonFormatter, log_context

FAMILIES = [
    "treadle_rounds",
    "treadle_round_seconds",
    "treadle_tool_seconds",
    "treadle_model_tokens",
    "treadle_model_cost",
    "treadle_runs",
    "treadle_waiting_runs",
    "treadle_queue_depth",
    "treadle_retries",
    "treadle_reaper_redrives",
]


def _value(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_metrics_move_when_runs_execute(
    client: TestClient, sqlite_rt: Runtime, stub: StubBroker
) -> None:
    agent = {
        "kind": "agent",
        "tools": ["calculator"],
        "model": {
            "provider": "scripted",
            "replies": [
                {
                    "tool_calls": [
                        {"id": "c", "name": "calculator", "arguments": {"expression": "2+2"}}
                    ]
                },
                {"text": "4"},
            ],
        },
    }
    before = client.get("/metrics").text
    client.post("/v1/runs", json={"agent": agent, "input": "2+2?"})
    stub.drain(sqlite_rt)
    after = client.get("/metrics").text
    missing = [f for f in FAMILIES if not re.search(rf"^# HELP {f}(_total)? ", after, re.M)]
    assert missing == []
    assert (
        _value(after, "treadle_rounds_total", outcome="committed")
        - _value(before, "treadle_rounds_total", outcome="committed")
        == 2
    )
    assert (
        _value(after, "treadle_tool_seconds_count", tool="calculator")
        - _value(before, "treadle_tool_seconds_count", tool="calculator")
        == 1
    )
    assert _value(after, "treadle_model_tokens_total") > _value(
        before, "treadle_model_tokens_total"
    )
    assert _value(after, "treadle_runs", status="completed") == 1
    assert _value(after, "treadle_round_seconds_count", phase="model") >= 2


def test_json_logs_carry_the_run_context() -> None:
    record = logging.LogRecord("treadle.round", logging.INFO, __file__, 1, "hello %s", ("x",), None)
    with log_context(run_id="run_1", call_id="c9"):
        from shared.logs import _ContextFilter

        _ContextFilter().filter(record)
    out = json.loads(JsonFormatter().format(record))
    assert out["message"] == "hello x" and out["run_id"] == "run_1" and out["call_id"] == "c9"
