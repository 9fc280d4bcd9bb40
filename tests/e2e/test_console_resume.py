"""The console's resume button, in a real browser (fixtures: ``test_console``): a cancelled
run is taken up again from the page and followed live to its next pause."""

from __future__ import annotations

from typing import Any

import httpx

from tests.e2e.test_console import browser, page, shot, sync_api, up  # noqa: F401  (fixtures)
from tests.support import wait_for


def test_resume_a_cancelled_run_from_the_page(up: str, page: Any, sync_api: Any) -> None:  # noqa: F811
    expect = sync_api.expect
    run = httpx.post(f"{up}/v1/runs", json={"agent": "demo-assistant", "input": "note"}).json()
    wait_for(
        lambda: httpx.get(f"{up}/v1/runs/{run['id']}").json()["status"] == "waiting",
        20,
        what="waiting run",
    )
    assert httpx.post(f"{up}/v1/runs/{run['id']}/cancel").json()["status"] == "cancelled"
    page.goto(f"{up}/#/runs/{run['id']}")
    expect(page.get_by_test_id("run-status")).to_have_text("cancelled")
    page.get_by_test_id("resume-run").click()
    expect(page.get_by_test_id("approval-card")).to_be_visible()  # the next round's pause
    expect(page.get_by_test_id("run-status")).to_have_text("waiting")
    expect(page.get_by_test_id("resume-run")).to_have_count(0)
    shot(page, "console-resumed")
    again = httpx.get(f"{up}/v1/runs/{run['id']}").json()
    assert again["status"] == "waiting" and again["pending"]["kind"] == "approval"
