"""The ``treadle`` client commands against a real ``treadle up``: submit, wait,
watch, answer, approve, cancel, runs, show, exit codes and ``--json``; and in a real terminal
(a pty driven by pexpect): ``treadle demo --interactive`` and ``submit --watch`` answering
with the arrow keys, free text and the approval checklist."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.servers import cli, embedded_env, need_module, treadle_up
from tests.support import ROOT, wait_for

DOWN, ENTER, SPACE = "\x1b[B", "\r", " "


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with treadle_up(tmp_path_factory.mktemp("cli")) as url:
        yield url


def _json(out: Any) -> dict[str, Any]:
    assert out.stdout.strip(), out.stderr
    value: dict[str, Any] = json.loads(out.stdout)
    return value


def _waiting(up: str, run_id: str, kind: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        run: dict[str, Any] = httpx.get(f"{up}/v1/runs/{run_id}").json()
        pending = run.get("pending") or {}
        return run if run["status"] == "waiting" and pending.get("kind") == kind else None

    result: dict[str, Any] = wait_for(check, 20, what=f"waiting on {kind}")
    return result


def test_submit_wait_completes_with_exit_0(up: str) -> None:
    out = cli("submit", "What is 17 * 23?", "--wait", "--json", url=up)
    assert out.returncode == 0, out.stderr
    run = _json(out)
    assert run["status"] == "completed" and "391" in run["result"]["text"]
    shown = cli("show", run["id"], url=up)
    assert shown.returncode == 0 and "calculator" in shown.stdout and "391" in shown.stdout


def test_spec_from_flags(up: str) -> None:
    out = cli(
        "submit",
        "Hi",
        "--kind",
        "chat",
        "--model",
        "demo",
        "--system",
        "Be brief.",
        "--wait",
        "--json",
        url=up,
    )
    run = _json(out)
    assert out.returncode == 0 and run["kind"] == "chat"
    assert run["agent"]["system_prompt"] == "Be brief."


def test_agent_file_and_stdin_input(up: str, tmp_path: Path) -> None:
    spec = tmp_path / "agent.yaml"
    spec.write_text("kind: agent\nmodel: demo\ntools: [calculator]\n")
    out = cli(
        "submit", "-", "--agent", str(spec), "--wait", "--json", url=up, stdin="What is 6 * 7?"
    )
    assert out.returncode == 0 and "42" in _json(out)["result"]["text"]


def test_wait_on_a_pause_exits_3_then_answer_and_approve_by_flags(up: str) -> None:
    out = cli("submit", "Save a note", "-a", "demo-assistant", "--wait", "--json", url=up)
    assert out.returncode == 3, out.stderr
    run = _json(out)
    assert run["status"] == "waiting" and run["pending"]["kind"] == "ask"

    answered = cli("answer", run["id"], "--answer", "Shopping list", "--json", url=up)
    assert answered.returncode == 0, answered.stderr
    _waiting(up, run["id"], "approval")
    wrong = cli("answer", run["id"], "--answer", "x", url=up)
    assert wrong.returncode == 2 and "not waiting on a question" in wrong.stderr

    approved = cli(
        "approve",
        run["id"],
        "--reject",
        "call_save",
        "--note",
        "not now",
        "--watch",
        "--no-input",
        "--json",
        url=up,
    )
    assert approved.returncode == 0, approved.stderr
    final = _json(approved)
    assert final["status"] == "completed"
    calls = httpx.get(f"{up}/v1/runs/{run['id']}/tool-calls").json()["tool_calls"]
    by_name = {c["name"]: c for c in calls}
    assert "shopping-list" in by_name["ask_user"]["result"]
    assert by_name["save_note"]["result"].startswith("Declined")


def _at_approval(up: str) -> tuple[str, str]:
    run = _json(cli("submit", "Save a note", "-a", "demo-assistant", "--json", url=up))
    _waiting(up, run["id"], "ask")
    assert cli("answer", run["id"], "-a", "reminder", url=up).returncode == 0
    pending = _waiting(up, run["id"], "approval")["pending"]
    return run["id"], pending["items"][0]["call_id"]


def test_approve_with_edited_arguments_and_reject_with_a_message(up: str) -> None:
    run_id, call_id = _at_approval(up)
    bad = cli("approve", run_id, "--edit", f'{call_id}={{"title": 5}}', url=up)
    assert bad.returncode == 2 and "save_note" in bad.stderr  # the tool's schema, a 422
    edited = f'{call_id}={{"title": "Edited", "text": "by hand"}}'
    out = cli("approve", run_id, "--edit", edited, "--watch", "--no-input", "--json", url=up)
    assert out.returncode == 0, out.stderr
    assert _json(out)["status"] == "completed"
    calls = httpx.get(f"{up}/v1/runs/{run_id}/tool-calls").json()["tool_calls"]
    save = next(c for c in calls if c["name"] == "save_note")
    assert "Saved note 'Edited' (7 characters)" in save["result"], save

    run_id, call_id = _at_approval(up)
    out = cli("approve", run_id, "--reject", f"{call_id}=wrong folder", "--watch", url=up)
    assert out.returncode == 0, out.stderr
    msgs = httpx.get(f"{up}/v1/runs/{run_id}/messages").json()["messages"]
    assert "Declined by user: wrong folder" in [m["content"] for m in msgs if m["role"] == "tool"]


def test_submit_waits_and_shows_the_plan_and_the_question(up: str) -> None:
    out = cli("submit", "Plan a trip", "-a", "demo-planner", url=up)
    assert out.returncode == 3, out.stderr  # waiting for an answer
    assert "plan: Trip" in out.stdout and "What kind of trip" in out.stdout
    detached = cli("submit", "Plan a trip", "-a", "demo-planner", "--detach", url=up)
    assert detached.returncode == 0 and "submitted" in detached.stdout


def test_approve_all_and_watch_prints_the_run(up: str) -> None:
    run = _json(cli("submit", "Save a note", "-a", "demo-assistant", "--json", url=up))
    _waiting(up, run["id"], "ask")
    assert cli("answer", run["id"], "-a", "reminder", url=up).returncode == 0
    _waiting(up, run["id"], "approval")
    assert cli("approve", run["id"], "--all", url=up).returncode == 0
    out = cli("watch", run["id"], url=up)
    assert out.returncode == 0, out.stderr
    for text in (
        "Save a note",
        "round 4",
        "save_note",
        "Saved note",
        "plan: Save a note",
        "completed",
    ):
        assert text in out.stdout, (text, out.stdout)


def test_cancel_runs_and_errors(up: str) -> None:
    run = _json(cli("submit", "Save a note", "-a", "demo-assistant", "--json", url=up))
    _waiting(up, run["id"], "ask")
    cancelled = cli("cancel", run["id"], "--json", url=up)
    assert cancelled.returncode == 0 and _json(cancelled)["status"] == "cancelled"
    assert cli("watch", run["id"], "--json", url=up).returncode == 1

    listed = _json(cli("runs", "--status", "cancelled", "--json", url=up))
    assert run["id"] in [r["id"] for r in listed["runs"]]
    assert {r["status"] for r in listed["runs"]} == {"cancelled"}
    table = cli("runs", "--limit", "5", url=up)
    assert table.returncode == 0 and run["id"] in table.stdout and "cancelled" in table.stdout

    missing = cli("show", "run_nope", url=up)
    assert missing.returncode == 2 and "404" in missing.stderr
    down = cli("runs", url="http://127.0.0.1:9")
    assert down.returncode == 2 and "cannot reach" in down.stderr
    usage = cli("submit", "x", "-a", "demo", "--tool", "calculator", url=up)
    assert usage.returncode == 2 and "not a file" in usage.stderr


# -- in a real terminal (pty)


def _spawn(args: list[str], env: dict[str, str]) -> Any:
    pexpect = need_module("pexpect")
    env = {**env, "TERM": "xterm-256color", "COLUMNS": "110", "LINES": "40"}
    env.pop("NO_COLOR", None)
    child = pexpect.spawn(
        sys.executable,
        ["-m", "scheduler.cli", *args],
        cwd=str(ROOT),
        env=env,
        encoding="utf-8",
        timeout=30,
        dimensions=(40, 110),
    )
    child.logfile_read = _Log(
        Path(os.environ.get("TREADLE_TEST_ARTIFACTS", ROOT / "test-artifacts"))
        / f"pty-{args[0]}.log"
    )
    return child


def _exit_status(child: Any) -> int:
    child.expect(need_module("pexpect").EOF, timeout=20)
    child.close()
    return int(child.exitstatus)


class _Log:
    """Keeps what the terminal showed (a test artifact)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fh = path.open("w", encoding="utf-8")

    def write(self, data: str) -> None:
        self.fh.write(data)

    def flush(self) -> None:
        self.fh.flush()


def test_demo_interactive_in_a_terminal(tmp_path: Path) -> None:
    child = _spawn(["demo", "--interactive"], embedded_env(tmp_path))
    child.expect("Which note should I save")
    child.expect("enter pick")  # the picker is drawn
    child.send(DOWN)  # Meeting summary → Shopping list
    child.send(ENTER)
    child.expect("Shopping list")
    child.expect("Approve these writes")
    child.expect("enter confirm")
    child.send(ENTER)  # the write is ticked: approve it
    child.expect("approving 1, rejecting 0")
    child.expect("Done. I asked what to save")
    child.expect("completed")
    assert _exit_status(child) == 0


def test_submit_watch_free_text_and_reject_in_a_terminal(up: str, tmp_path: Path) -> None:
    env = {**embedded_env(tmp_path), "TREADLE_URL": up}
    child = _spawn(["submit", "Save a note", "-a", "demo-assistant", "--watch"], env)
    child.expect("Which note should I save")
    child.expect("enter pick")
    child.send("4")  # "Something else (type it)"
    child.expect("your answer")
    child.sendline("a haiku about queues")
    child.expect("Approve these writes")
    child.expect("enter confirm")
    child.send(SPACE)  # untick the write
    child.send(ENTER)
    child.expect("Why not save_note")
    child.sendline("wrong folder")
    child.expect("approving 0, rejecting 1")
    child.expect("completed")
    assert _exit_status(child) == 0
    runs = httpx.get(f"{up}/v1/runs", params={"limit": 1}).json()["runs"]
    calls = httpx.get(f"{up}/v1/runs/{runs[0]['id']}/tool-calls").json()["tool_calls"]
    by_name = {c["name"]: c for c in calls}
    assert "a haiku about queues" in by_name["ask_user"]["result"]
    assert by_name["save_note"]["result"] == "Declined by user: wrong folder"


def test_spend_envelopes_from_the_cli(up: str) -> None:
    made = cli("spend", "set", "tenant", "--cap", "2.5", "--period", "day", url=up)
    assert made.returncode == 0, made.stderr
    listed = cli("spend", "--json", url=up)
    assert listed.returncode == 0, listed.stderr
    (envelope,) = json.loads(listed.stdout)
    assert envelope["scope"] == "tenant" and envelope["cap"] == 2.5
    shown = cli("spend", url=up)
    assert "tenant" in shown.stdout and "2.5" in shown.stdout
    gone = cli("spend", "delete", "tenant", url=up)
    assert gone.returncode == 0, gone.stderr
    assert json.loads(cli("spend", "--json", url=up).stdout) == []
    bad = cli("spend", "set", "tenant", "someone", "--cap", "1", url=up)
    assert bad.returncode == 2 and "takes no name" in bad.stderr
