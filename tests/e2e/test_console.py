"""The web console in a real browser: Debian's Chromium, headless, driven by
Playwright, against ``treadle up`` on a free loopback port. Submit a run from the form, watch
it stream, answer the ask by clicking an option, approve the write, see it complete; and a
slowly streaming model's text on the page while the run is still running.

Screenshots go to ``test-artifacts/`` (git-ignored). Without Chromium the tests skip locally
and fail in CI (``.ci/system-deps.sh`` installs it).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared.llm.fake_server import FakeLLMServer, ReplySpec
from tests.e2e.servers import need_module, treadle_up
from tests.support import IN_CI, ROOT, knob, wait_for

CHROMIUM = os.environ.get("TREADLE_TEST_CHROMIUM", "/usr/bin/chromium")
# the slow model's pause between 60-byte pieces of its stream: 0.2 s (0.08 s under CI=true,
# a loaded machine: still seconds of streaming after the first words show)
CHUNK_S = knob("CONSOLE_CHUNK_S", 0.2, 0.08)
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = ROOT / "test-artifacts"
TIMEOUT_MS = 20_000


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with treadle_up(tmp_path_factory.mktemp("console")) as url:
        yield url


@pytest.fixture(scope="module")
def sync_api() -> Any:
    return need_module("playwright.sync_api")


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory, sync_api: Any) -> Iterator[Any]:
    if not shutil.which(CHROMIUM):
        msg = f"{CHROMIUM} not found: apt-get install chromium (or bash .ci/system-deps.sh)"
        pytest.fail(msg) if IN_CI else pytest.skip(msg)
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_api.sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile),
            executable_path=CHROMIUM,
            headless=True,
            args=ARGS,
            viewport={"width": 1440, "height": 900},
            color_scheme="dark",
        )
        context.set_default_timeout(TIMEOUT_MS)
        yield context
        context.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    refused: list[str] = []  # what the Content-Security-Policy blocked: nothing may be
    page.on(
        "console",
        lambda msg: refused.append(msg.text) if "Content Security Policy" in msg.text else None,
    )
    yield page
    page.close()
    assert not errors, f"JavaScript errors on the page: {errors}"
    assert not refused, f"the console broke its own Content-Security-Policy: {refused}"


def shot(page: Any, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=False)
    return path


def test_submit_answer_approve_complete_by_clicks(up: str, page: Any, sync_api: Any) -> None:
    expect = sync_api.expect
    page.goto(f"{up}/#/new")
    page.get_by_test_id("agent-select").select_option("demo-assistant")
    page.get_by_test_id("run-input").fill("Please save a note for me.")
    page.get_by_test_id("submit-run").click()

    page.wait_for_url("**/#/runs/run_*")
    run_id = page.url.rsplit("/", 1)[1]
    ask = page.get_by_test_id("ask-card")
    expect(ask).to_contain_text("Which note should I save?")
    expect(page.get_by_test_id("run-status")).to_have_text("waiting")
    expect(page.get_by_test_id("plan-board")).to_contain_text("Save a note")
    options = ask.get_by_test_id("ask-option")
    expect(options).to_have_count(3)
    expect(page.get_by_test_id("ask-send")).to_be_disabled()
    options.filter(has_text="Shopping list").click()
    shot(page, "console-ask")
    page.get_by_test_id("ask-send").click()

    approval = page.get_by_test_id("approval-card")
    expect(approval).to_contain_text("save_note")
    item = approval.get_by_test_id("approval-item")
    expect(item).to_have_count(1)
    expect(item).to_contain_text('"title": "Note from the treadle demo"')
    expect(page.get_by_test_id("approval-submit")).to_be_disabled()
    item.get_by_test_id("approve-item").click()
    shot(page, "console-approval")
    page.get_by_test_id("approval-submit").click()

    expect(page.get_by_test_id("run-status")).to_have_text("completed")
    expect(page.get_by_test_id("run-final")).to_contain_text("Completed")
    expect(page.get_by_test_id("answer-text").last).to_contain_text("Done. I asked what to save")
    tool = page.locator("[data-testid=tool-card][data-tool=save_note]")
    expect(tool).to_contain_text("Saved note")
    expect(page.locator("[data-testid=plan-board] .step-done")).to_have_count(3)
    expect(page.get_by_test_id("round")).to_have_count(4)
    expect(page.get_by_test_id("round-usage").first).to_contain_text("tok")
    expect(page.locator(f"[data-testid=run-item][data-run-id={run_id}]")).to_contain_text(
        "completed"
    )
    path = shot(page, "console-run")
    assert path.stat().st_size > 10_000

    run = httpx.get(f"{up}/v1/runs/{run_id}").json()
    assert run["status"] == "completed" and run["metadata"]["agent"] == "demo-assistant"


def test_text_streams_before_the_round_commits(up: str, page: Any, sync_api: Any) -> None:
    expect = sync_api.expect
    words = " ".join(f"word{i}" for i in range(40))
    with FakeLLMServer() as llm:
        llm.enqueue(ReplySpec(text=words, chunk_latency=CHUNK_S, chunk_bytes=60))
        model = {"provider": "openai", "base_url": llm.base_url, "model": "slow"}
        body = {"agent": {"kind": "chat", "model": model}, "input": "Stream slowly, please."}
        run_id = httpx.post(f"{up}/v1/runs", json=body, timeout=10).json()["id"]
        page.goto(f"{up}/#/runs/{run_id}")
        live = page.get_by_test_id("live-text")
        expect(live).to_contain_text("word3")
        partial = live.inner_text()
        run = httpx.get(f"{up}/v1/runs/{run_id}").json()
        assert run["status"] == "running", run  # the round has not committed yet
        assert "word39" not in partial and words.startswith(partial.strip())
        expect(page.get_by_test_id("round").first).to_have_class("round streaming")
        shot(page, "console-streaming")
        expect(page.get_by_test_id("run-status")).to_have_text("completed", timeout=60_000)
        expect(page.get_by_test_id("answer-text")).to_have_text(words)


def test_list_filters_cancel_and_key(up: str, page: Any, sync_api: Any) -> None:
    expect = sync_api.expect
    done = httpx.post(f"{up}/v1/runs", json={"agent": "demo-chat", "input": "hi"}).json()
    waiting = httpx.post(f"{up}/v1/runs", json={"agent": "demo-assistant", "input": "note"}).json()
    wait_for(
        lambda: httpx.get(f"{up}/v1/runs/{waiting['id']}").json()["status"] == "waiting",
        20,
        what="waiting run",
    )
    sent: list[str] = []
    page.on(
        "request",
        lambda r: sent.append(r.headers.get("authorization", "")) if "/v1/runs" in r.url else None,
    )
    page.goto(f"{up}/?key=trd_console_test#/runs/{waiting['id']}")
    assert "key=" not in page.url  # taken out of the address bar, kept in localStorage
    assert page.evaluate("localStorage.getItem('treadle.key')") == "trd_console_test"
    expect(page.get_by_test_id("ask-card")).to_be_visible()
    assert "Bearer trd_console_test" in sent

    page.get_by_test_id("filter-waiting").click()
    items = page.get_by_test_id("run-item")
    expect(items.filter(has_text=waiting["id"])).to_have_count(1)
    expect(items.filter(has_text=done["id"])).to_have_count(0)

    page.get_by_test_id("cancel-run").click()
    page.get_by_test_id("cancel-run").click()  # confirm
    expect(page.get_by_test_id("run-status")).to_have_text("cancelled")
    expect(page.get_by_test_id("ask-card")).to_have_count(0)
    page.get_by_test_id("filter-cancelled").click()
    expect(items.filter(has_text=waiting["id"])).to_have_count(1)
    page.evaluate("localStorage.removeItem('treadle.key')")


def _at_approval(up: str) -> dict[str, Any]:
    run: dict[str, Any] = httpx.post(
        f"{up}/v1/runs", json={"agent": "demo-assistant", "input": "Save a note"}
    ).json()

    def pending(kind: str) -> dict[str, Any] | None:
        got: dict[str, Any] = httpx.get(f"{up}/v1/runs/{run['id']}").json()
        return got["pending"] if (got.get("pending") or {}).get("kind") == kind else None

    ask = wait_for(lambda: pending("ask"), 20, what="the ask")
    answer = {"ask_id": ask["ask_id"], "answers": ["reminder"]}
    assert httpx.post(f"{up}/v1/runs/{run['id']}/answer", json=answer).status_code == 200
    wait_for(lambda: pending("approval"), 20, what="the approval")
    return run


def test_edit_the_arguments_then_reject_with_a_message(up: str, page: Any, sync_api: Any) -> None:
    expect = sync_api.expect
    run = _at_approval(up)
    page.goto(f"{up}/#/runs/{run['id']}")
    item = page.get_by_test_id("approval-item")
    expect(item.get_by_test_id("edit-args")).to_be_hidden()
    item.get_by_test_id("edit-item").click()
    box = item.get_by_test_id("edit-args")
    expect(box).to_be_visible()
    assert '"title"' in box.input_value()  # starts as what the model proposed
    box.fill('{"title": "Edited"')
    page.get_by_test_id("approval-submit").click()
    expect(page.get_by_test_id("approval-card")).to_contain_text("not JSON")
    box.fill('{"title": 7, "text": "by hand"}')
    page.get_by_test_id("approval-submit").click()  # the server checks the tool's schema
    expect(page.get_by_test_id("approval-card")).to_contain_text("Invalid arguments for save_note")
    box.fill('{"title": "Edited", "text": "by hand"}')
    submit = page.get_by_test_id("approval-submit")
    expect(submit).to_have_text("Submit: 0 approve, 1 edit, 0 reject")
    shot(page, "console-approval-edit")
    page.get_by_test_id("approval-submit").click()
    expect(page.get_by_test_id("run-status")).to_have_text("completed")
    tool = page.locator("[data-testid=tool-card][data-tool=save_note]")
    expect(tool).to_contain_text("Saved note 'Edited' (7 characters)")
    expect(tool.get_by_test_id("tool-decision")).to_have_text("edited by default")
    expect(tool.get_by_test_id("tool-proposed")).to_contain_text('"title"')
    tool.scroll_into_view_if_needed()
    shot(page, "console-approval-edited")

    run = _at_approval(up)
    page.goto(f"{up}/#/runs/{run['id']}")
    item = page.get_by_test_id("approval-item")
    item.get_by_test_id("reject-item").click()
    item.get_by_test_id("reject-message").fill("wrong folder")
    page.get_by_test_id("approval-submit").click()
    expect(page.get_by_test_id("run-status")).to_have_text("completed")
    tool = page.locator("[data-testid=tool-card][data-tool=save_note]")
    expect(tool).to_contain_text("Declined by user: wrong folder")


def _memory_run(up: str, tool: str, args: dict[str, Any]) -> str:
    spec = {
        "kind": "agent",
        "tools": [tool],
        "model": {
            "provider": "scripted",
            "replies": [
                {"tool_calls": [{"id": "m1", "name": tool, "arguments": args}]},
                {"text": "ok"},
            ],
        },
    }
    body = {"agent": spec, "input": "hi", "metadata": {"user_id": "ana"}}
    run_id: str = httpx.post(f"{up}/v1/runs", json=body, timeout=10).json()["id"]
    wait_for(
        lambda: httpx.get(f"{up}/v1/runs/{run_id}").json()["status"] == "completed",
        20,
        what="memory run",
    )
    return run_id


def test_a_runs_memory_reads_and_writes_are_shown(up: str, page: Any, sync_api: Any) -> None:
    expect = sync_api.expect
    wrote = _memory_run(up, "remember", {"fact": "Ana prefers tea", "key": "drink"})
    page.goto(f"{up}/#/runs/{wrote}")
    card = page.get_by_test_id("memory-card")
    expect(card.locator("[data-type='memory.written']")).to_contain_text("drink")
    expect(card).to_contain_text("memories / ana")
    read = _memory_run(up, "recall", {"query": "what does Ana drink"})
    page.goto(f"{up}/#/runs/{read}")
    event = page.get_by_test_id("memory-card").locator("[data-type='memory.read']")
    expect(event).to_contain_text("what does Ana drink")
    expect(event).to_contain_text("drink")
    shot(page, "console-memory")


def test_the_home_page_shows_the_spend_envelopes(up: str, page: Any, sync_api: Any) -> None:
    expect = sync_api.expect
    put = httpx.put(f"{up}/v1/spend/tenant", json={"cap": 3.0, "period": "month"})
    assert put.status_code == 200, put.text
    try:
        page.goto(f"{up}/#/")
        envelope = page.get_by_test_id("spend-tenant")
        expect(envelope).to_contain_text("month")
        expect(envelope).to_contain_text("3")
        shot(page, "spend")
    finally:
        httpx.delete(f"{up}/v1/spend/tenant")
