"""The helper kinds (SPEC H-1..H-3) through real Celery workers on Redis + PostgreSQL, with
the API in-process: each completes with its structured result in GET /v1/runs/{id}."""

from __future__ import annotations

import json
from typing import Any

from fastapi.testclient import TestClient

from scheduler.app import create_app
from shared.engine.runtime import Runtime
from tests.support import WorkerProcs, wait_for

CATEGORIES = [
    {"key": "weather", "description": "questions about weather"},
    {"key": "travel", "description": "trips and bookings"},
    {"key": "other", "description": "anything else"},
]


def _scripted(*texts: str, **profile: Any) -> dict[str, Any]:
    return {"provider": "scripted", "replies": [{"text": t} for t in texts], **profile}


def _finish(client: TestClient, run_id: str, timeout: float = 30) -> dict[str, Any]:
    done: dict[str, Any] = wait_for(
        lambda: (
            (r := client.get(f"/v1/runs/{run_id}").json())["status"]
            in ("completed", "failed", "cancelled")
            and r
        ),
        timeout,
        what=f"run {run_id} to finish",
    )
    return done


def test_each_helper_kind_completes_with_its_structured_result(
    prod_rt: Runtime, workers: WorkerProcs
) -> None:
    workers.start("alpha")
    classify = {
        "kind": "classify",
        "categories": CATEGORIES,
        "model": _scripted('{"category": "travel", "reason": "a train"}'),
    }
    extract = {
        "kind": "extract",
        "model": _scripted('Sure: {city: "Rome", days: "2"}'),
        "fields": [
            {"name": "city", "type": "string", "required": True},
            {"name": "days", "type": "integer"},
            {"name": "budget", "type": "number", "required": True, "default": 0},
        ],
    }
    expand = {
        "kind": "expand_query",
        "keep": 2,
        "model": _scripted(
            json.dumps(
                ["train tickets Rome", "book train to Rome", "Rome rail timetable", "Book a train"]
            )
        ),
    }
    with TestClient(create_app(lambda: prod_rt)) as client:
        specs = {"classify": classify, "extract": extract, "expand_query": expand}
        ids = {
            kind: client.post("/v1/runs", json={"agent": spec, "input": "Book a train"}).json()[
                "id"
            ]
            for kind, spec in specs.items()
        }
        runs = {kind: _finish(client, run_id) for kind, run_id in ids.items()}
    assert {k: r["status"] for k, r in runs.items()} == dict.fromkeys(ids, "completed")
    # SPEC H-1: {category, reason?}
    assert runs["classify"]["result"]["category"] == "travel"
    assert runs["classify"]["result"]["reason"] == "a train"
    # SPEC H-2: {fields, success}; coerced, defaults filled
    assert runs["extract"]["result"]["fields"] == {"city": "Rome", "days": 2, "budget": 0}
    assert runs["extract"]["result"]["success"] is True
    # SPEC H-3: original + at most `keep`, de-duplicated
    queries = runs["expand_query"]["result"]["queries"]
    assert queries[0] == "Book a train" and len(queries) == 3
    assert all(r["result"]["text"] for r in runs.values())
    assert all(r["round"] == 1 and r["usage"]["output_tokens"] > 0 for r in runs.values())
