"""Spend envelopes over the API (docs/cost.md): set, list, change, delete; bad input is a 4xx
with the error shape and writes nothing; tenants see their own only."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from shared.engine.runtime import Runtime
from shared.store import schedules


def _put(client: TestClient, path: str, **body: Any) -> Any:
    return client.put(f"/v1/spend/{path}", json={"cap": 1.0, "period": "day", **body})


def test_envelopes_are_set_listed_changed_and_deleted(client: TestClient) -> None:
    assert client.get("/v1/spend").json() == {"envelopes": []}
    made = _put(client, "tenant", cap=5.0, period="month")
    assert made.status_code == 200, made.text
    view = made.json()
    assert view["scope"] == "tenant" and view["key"] is None and view["cap"] == 5.0
    assert view["spent"] == 0 and view["reserved"] == 0 and view["left"] == 5.0
    assert view["period_start"].endswith("Z") and view["period_end"] > view["period_start"]
    assert _put(client, "agents/support", on_exceed="fail").status_code == 200
    assert _put(client, "tenant", cap=7.5, period="month").json()["cap"] == 7.5
    listed = client.get("/v1/spend").json()["envelopes"]
    assert [(e["scope"], e["key"], e["cap"]) for e in listed] == [
        ("agent", "support", 1.0),
        ("tenant", None, 7.5),
    ]
    assert client.delete("/v1/spend/agents/support").status_code == 204
    assert client.delete("/v1/spend/agents/support").status_code == 404
    assert [e["scope"] for e in client.get("/v1/spend").json()["envelopes"]] == ["tenant"]


def test_a_cron_envelope_names_a_cron_of_the_tenant(client: TestClient, sqlite_rt: Runtime) -> None:
    assert _put(client, "crons/cron_nope").status_code == 404
    made = client.post(
        "/v1/crons",
        json={"agent": {"kind": "chat", "model": "demo"}, "input": "hi", "schedule": "0 * * * *"},
    )
    assert made.status_code == 201, made.text
    assert _put(client, f"crons/{made.json()['id']}").status_code == 200
    assert schedules  # the store module the route checks the cron with


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/spend/tenant/someone", {"cap": 1, "period": "day"}),
        ("/v1/spend/planets/x", {"cap": 1, "period": "day"}),
        ("/v1/spend/agents/bad@2", {"cap": 1, "period": "day"}),  # a name, any version
        ("/v1/spend/tenant", {"cap": -1, "period": "day"}),
        ("/v1/spend/tenant", {"cap": 1, "period": "week"}),
        ("/v1/spend/tenant", {"cap": 1, "period": "day", "on_exceed": "panic"}),
        ("/v1/spend/tenant", {"cap": 1, "period": "day", "extra": 1}),
        ("/v1/spend/tenant", {"period": "day"}),
    ],
)
def test_bad_input_is_refused_and_writes_nothing(
    client: TestClient, path: str, body: dict[str, Any]
) -> None:
    r = client.put(path, json=body)
    assert 400 <= r.status_code < 500, r.text
    assert set(r.json()["error"]) >= {"code", "message"}
    assert client.get("/v1/spend").json() == {"envelopes": []}
