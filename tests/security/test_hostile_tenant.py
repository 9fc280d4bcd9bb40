"""Hostile tenants: every finding of the probe, numbered as in the issue, reproduced through the
HTTP API against real ``celery worker`` processes on PostgreSQL + Redis, with API keys for two
tenants (acme, the victim; globex, the attacker) and test doubles off — and each one held.

The API runs in this process (its CPU is measured here); workers are subprocesses carrying
secrets in their environment. Models are fake OpenAI-compatible servers on 127.0.0.1
(allow-listed, as an operator would allow a host). Engine-side parts (findings 2 and 6: the
model call's deadline, poison replies) rely on the engine hook in ``shared/engine/round.py``.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa
from fastapi.testclient import TestClient
from standardwebhooks import Webhook

from scheduler.app import create_app
from shared.config import Settings
from shared.engine.runtime import Runtime
from shared.engine.webhooks import tenant_secret
from shared.errors import SpecError
from shared.llm.fake_server import FakeLLMServer, ReplySpec
from shared.llm.profiles import load_profiles
from shared.store import keys
from shared.store.tables import metadata
from shared.tools import sandbox
from tests.conftest import SESSION
from tests.files_support import pdf_bomb
from tests.mcp_hostile import HostileMcp
from tests.receiver import Receiver
from tests.security.test_hostile_input import EDGE
from tests.support import ROOT, WorkerProcs, need_service, wait_for

SECRET = f"s3cr3t-{uuid.uuid4().hex}"
HOOK_SECRET = "whsec_" + "aG9zdGlsZS10ZW5hbnQtd2ViaG9vay1zZWNyZXQ="
OPERATOR = "shared-gpt"
FINAL = ("completed", "failed", "cancelled")

Responder = Callable[[dict[str, Any]], Any]


# --- the fleet ------------------------------------------------------------------------------


@dataclass
class Fleet:
    """The API (this process, auth required) and its workers, two tenants' keys."""

    rt: Runtime
    api: TestClient
    keys: dict[str, str]
    workers: WorkerProcs
    worker_env: dict[str, str]
    operator_llm: FakeLLMServer
    pids: list[int] = field(default_factory=list)

    def start(self, concurrency: int = 8) -> int:
        name = self.workers.start(concurrency=concurrency)
        pid = self.workers.procs[name].pid
        self.pids.append(pid)
        return pid

    def headers(self, tenant: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[tenant]}"}

    def submit(self, tenant: str, agent: Any, text: str = "hi", **body: Any) -> Any:
        return self.api.post(
            "/v1/runs", json={"agent": agent, "input": text, **body}, headers=self.headers(tenant)
        )

    def run(self, tenant: str, run_id: str) -> dict[str, Any]:
        got = self.api.get(f"/v1/runs/{run_id}", headers=self.headers(tenant))
        assert got.status_code == 200, got.text
        return dict(got.json())

    def finish(self, tenant: str, run_id: str, timeout: float = 60) -> dict[str, Any]:
        def final() -> dict[str, Any] | None:
            run = self.run(tenant, run_id)
            return run if run["status"] in FINAL else None

        return dict(wait_for(final, timeout, interval=0.1, what=f"run {run_id} to end"))


def _profiles_file(tmp: Path, llm: FakeLLMServer) -> Path:
    path = tmp / "profiles.json"
    profile = {"base_url": llm.base_url, "model": "m", "max_concurrent": 8}
    path.write_text(json.dumps({"profiles": {OPERATOR: profile}}), encoding="utf-8")
    return path


@pytest.fixture
def fleet(
    tmp_path: Path, pg_url: str, pg_engine: sa.engine.Engine, redis_url: str
) -> Iterator[Fleet]:
    from shared.celery_app import make_app
    from shared.wiring import CeleryPublisher

    with FakeLLMServer() as operator_llm:
        profiles = _profiles_file(tmp_path, operator_llm)
        shared_env = {
            "TREADLE_DATABASE_URL": pg_url,
            "TREADLE_BROKER_URL": redis_url,
            "TREADLE_BROKER_PREFIX": f"t{SESSION}:",
            "TREADLE_ALLOW_HOSTS": "127.0.0.1",
            "TREADLE_PROFILES_FILE": str(profiles),
            "TREADLE_WEBHOOK_SECRET_ENV": "HOSTILE_HOOK_SECRET",
            "TREADLE_ALLOW_TEST_MODELS": "false",
        }
        worker_env = {
            **shared_env,
            "TREADLE_PLUGINS": "tests.plugins",
            "TREADLE_TEST_DNS": "rebind.test=127.0.0.1",  # what the workers' resolver says
            "TREADLE_TEST_PROVIDER_KEY": SECRET,  # secrets a worker holds
            "HOSTILE_HOOK_SECRET": HOOK_SECRET,
            "TREADLE_REDRIVE_SECONDS": "15",
        }
        settings = Settings(
            database_url=pg_url,
            broker_url=redis_url,
            broker_prefix=f"t{SESSION}:",
            auth="required",
            allow_hosts="127.0.0.1",
            profiles_file=str(profiles),
            webhook_secret_env="HOSTILE_HOOK_SECRET",
            allow_test_models=False,
        )
        celery_app = make_app(settings)
        rt = Runtime(
            engine=pg_engine,
            settings=settings,
            publish=CeleryPublisher(celery_app),
            profiles=load_profiles(profiles),
        )
        with pg_engine.begin() as conn:
            made = {t: keys.create_key(conn, t).secret for t in ("acme", "globex")}
        procs = WorkerProcs(worker_env, tmp_path)
        try:
            with TestClient(create_app(lambda: rt)) as api:
                yield Fleet(rt, api, made, procs, worker_env, operator_llm)
        finally:
            procs.stop_all()
            celery_app.close()


def _model(llm: FakeLLMServer, **kw: Any) -> dict[str, Any]:
    return {"provider": "openai", "base_url": llm.base_url, "model": "m", **kw}


def _agent(llm: FakeLLMServer, tools: list[Any] | None = None, **kw: Any) -> dict[str, Any]:
    return {"kind": "agent", "model": _model(llm), "tools": tools or [], **kw}


def _call(name: str, arguments: dict[str, Any], call_id: str) -> dict[str, Any]:
    return {"id": call_id, "name": name, "arguments": arguments}


def _by_round(*replies: Any) -> Responder:
    """Reply number N to a request that carries N assistant turns (stateless, like a model)."""

    def respond(body: dict[str, Any]) -> Any:
        n = sum(1 for m in body["messages"] if m.get("role") == "assistant")
        return replies[min(n, len(replies) - 1)]

    return respond


def _row_counts(rt: Runtime) -> dict[str, int]:
    with rt.engine.connect() as conn:
        return {
            t.name: int(conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one())
            for t in metadata.sorted_tables
        }


def _all_text(rt: Runtime) -> str:
    """Every column of every row of every table, as text."""
    out = []
    with rt.engine.connect() as conn:
        for table in metadata.sorted_tables:
            for row in conn.execute(sa.select(table)):
                out.append(json.dumps(list(row), default=str, ensure_ascii=False))
    return "\n".join(out)


def _cpu_of(pid: int) -> float:
    """A process's CPU seconds, its reaped children's included (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime stime cutime cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def _own_cpu() -> float:
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


# --- 1. the sandbox leaks the worker's environment ----------------------------------------

LEAK_PROBE = """
import json, os
seen = {}
for pid in os.listdir('/proc'):
    if pid.isdigit():
        for what in ('environ', 'cmdline'):
            try:
                seen[f'{pid}/{what}'] = open(f'/proc/{pid}/{what}', 'rb').read().decode('latin-1')
            except OSError as e:
                seen[f'{pid}/{what}'] = f'denied {e.errno}'
seen['cwd'] = str(os.path.exists(WORKER_CWD))
print(json.dumps(seen))
"""


def test_1_run_python_reads_no_secret_of_the_worker(fleet: Fleet) -> None:
    reason = sandbox.unavailable_reason()
    if reason:
        need_service("bubblewrap", RuntimeError(reason))
    fleet.start()
    code = LEAK_PROBE.replace("WORKER_CWD", repr(str(ROOT)))
    replies = [{"tool_calls": [_call("run_python", {"code": code}, "probe")]}, "done"]
    with FakeLLMServer(_by_round(*replies)) as llm:
        made = fleet.submit("globex", _agent(llm, tools=["run_python"]))
        assert made.status_code == 201, made.text
        run = fleet.finish("globex", made.json()["id"])
    assert run["status"] == "completed", run
    calls = fleet.api.get(
        f"/v1/runs/{run['id']}/tool-calls", headers=fleet.headers("globex")
    ).json()["tool_calls"]
    [probe] = calls
    text = json.dumps(probe["result"])  # what the code saw (its arguments name the cwd)
    assert '\\"1/environ\\": \\"\\"' in text  # PID 1 inside (bubblewrap): an empty environment
    assert '\\"cwd\\": \\"False\\"' in text
    for secret in (SECRET, HOOK_SECRET, fleet.rt.settings.database_url.rsplit("/", 1)[1]):
        assert secret not in text
    assert str(ROOT) not in text


# --- 2. any tenant can hold every worker thread -------------------------------------------


def test_2_hostile_model_calls_do_not_hold_the_workers(fleet: Fleet) -> None:
    """Engine hook: the model call ends at the run's deadline (the stream is closed)."""
    scripted = {"kind": "chat", "model": {"provider": "scripted", "replies": [{"sleep": 40}]}}
    refused = fleet.submit("globex", scripted)
    assert refused.status_code == 422 and "TREADLE_ALLOW_TEST_MODELS" in refused.text
    fleet.start(concurrency=4)

    def stall(body: dict[str, Any]) -> ReplySpec:
        text = str(body["messages"][-1]["content"])
        if "silent" in text:  # the stream starts, then nothing
            return ReplySpec(text="one two three", chunk_bytes=8, hang=40)
        return ReplySpec(text="never", first_byte_latency=40)  # not even headers

    with FakeLLMServer(stall) as bad, FakeLLMServer() as good:
        started = time.monotonic()
        baseline_run = fleet.submit("acme", {"kind": "chat", "model": _model(good)}).json()
        assert fleet.finish("acme", baseline_run["id"])["status"] == "completed"
        baseline = time.monotonic() - started
        hostile = [
            fleet.submit(
                "globex",
                {"kind": "chat", "model": _model(bad), "budget": {"deadline_s": 1}},
                text=f"{kind} {i}",
            ).json()["id"]
            for i, kind in enumerate(["silent", "headless", "silent", "headless"])
        ]
        wait_for(lambda: len(bad.requests) >= 4, 20, what="four hostile calls in flight")
        started = time.monotonic()
        victim = fleet.submit("acme", {"kind": "chat", "model": _model(good)}).json()
        assert fleet.finish("acme", victim["id"], 30)["status"] == "completed"
        took = time.monotonic() - started
        ended = [fleet.finish("globex", run_id, 30) for run_id in hostile]
    assert took <= baseline + 2.0, f"the victim's run took {took:.1f}s (alone: {baseline:.1f}s)"
    assert all(r["stop_reason"] == "budget_deadline" for r in ended), ended


# --- 3. PDF bomb ------------------------------------------------------------------------------


def test_3_a_pdf_bomb_is_refused_by_datasets_and_bounded_in_read_files(fleet: Fleet) -> None:
    bomb = pdf_bomb()
    assert len(bomb) < 13_000
    acme = fleet.headers("acme")
    ds = fleet.api.post("/v1/datasets", json={"name": "docs"}, headers=acme).json()
    before = _row_counts(fleet.rt)
    cpu = _own_cpu()
    got = fleet.api.post(
        f"/v1/datasets/{ds['id']}/documents",
        files={"file": ("bomb.pdf", bomb, "application/pdf")},
        headers=acme,
    )
    api_cpu = _own_cpu() - cpu
    # refused at the text limits, or (a slower machine) at the CPU limit first
    assert got.status_code == 422 and ("limits" in got.text or "CPU" in got.text), got.text
    assert api_cpu <= 5.0 + 1.0, f"the API spent {api_cpu:.1f}s of CPU"
    assert _row_counts(fleet.rt) == before  # no chunk, no document
    pid = fleet.start()
    upload = fleet.api.post(
        "/v1/files", files={"file": ("bomb.pdf", bomb, "application/pdf")}, headers=acme
    ).json()
    replies = [{"tool_calls": [_call("read_files", {"file": "bomb.pdf"}, "read")]}, "done"]
    with FakeLLMServer(_by_round(*replies)) as llm:
        time.sleep(1.0)  # the worker settles after its start
        cpu = _cpu_of(pid)
        made = fleet.submit("acme", _agent(llm), attachments=[upload["id"]])
        run = fleet.finish("acme", made.json()["id"], 60)
        worker_cpu = _cpu_of(pid) - cpu
        time.sleep(0.5)
        idle = _cpu_of(pid)
        time.sleep(2.0)
        burning = _cpu_of(pid) - idle
    assert run["status"] == "completed", run
    [call] = fleet.api.get(f"/v1/runs/{run['id']}/tool-calls", headers=acme).json()["tool_calls"]
    result = str(call["result"])
    if "CPU" not in result:  # stopped at the character limit: a bounded text, read in pages
        chars = int(result.split(" of ", 2)[2].split("]", 1)[0])
        assert chars <= fleet.rt.settings.extract_max_chars + 200, result[:200]
    assert worker_cpu <= 5.0 + 2.0, f"the worker spent {worker_cpu:.1f}s of CPU"
    assert burning < 0.5, f"something keeps burning CPU after the run: {burning:.2f}s in 2s"


# --- 4. one tenant can pause another's model profile ---------------------------------------


def test_4_a_tenants_429_does_not_touch_another_tenants_runs(fleet: Fleet) -> None:
    fleet.start()

    def too_many(body: dict[str, Any]) -> ReplySpec:
        return ReplySpec(
            status=429, headers={"Retry-After": "120"}, body={"error": {"message": "slow down"}}
        )

    with FakeLLMServer(too_many) as bad:
        squat = fleet.submit(
            "globex", {"kind": "chat", "model": _model(bad, name=OPERATOR, max_concurrent=8)}
        )
        assert squat.status_code == 422 and "operator's model profile" in squat.text
        own = {"kind": "chat", "model": _model(bad, name="b-gpt", max_concurrent=8)}
        b_run = fleet.submit("globex", own).json()["id"]
        wait_for(lambda: bad.requests, 20, what="B's endpoint to answer 429")
        time.sleep(0.5)
        started = time.monotonic()
        a_run = fleet.submit("acme", {"kind": "chat", "model": OPERATOR}).json()["id"]
        assert fleet.finish("acme", a_run, 30)["status"] == "completed"
        took = time.monotonic() - started
        assert fleet.run("globex", b_run)["status"] in ("queued", "running")
        limiter = redis.Redis.from_url(fleet.rt.settings.broker_url)
        prefix = f"{fleet.rt.settings.broker_prefix}treadle:limit:"
        paused = {
            k.decode(): limiter.pttl(k) for k in limiter.scan_iter(f"{prefix}*:pause", count=1000)
        }
        fleet.api.post(f"/v1/runs/{b_run}/cancel", headers=fleet.headers("globex"))
    assert took < 10, f"A's run took {took:.1f}s"
    assert paused and all(":globex:" in k for k in paused), paused  # only B's own key
    assert all(0 < ttl <= 60_000 for ttl in paused.values()), paused  # Retry-After capped


# --- 5. DNS rebinding through a model base_url ----------------------------------------------


def test_5_a_model_base_url_rebound_to_loopback_is_refused_by_the_worker(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API resolves rebind.test to a public address, so the submit check passes; the
    workers' resolver (TREADLE_TEST_DNS) answers 127.0.0.1, where a server listens."""
    real = socket.getaddrinfo

    def public(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "rebind.test":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", int(port)))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", public)
    fleet.start()
    with FakeLLMServer() as private:
        port = private.base_url.rsplit(":", 1)[1].split("/")[0]
        model = {"provider": "openai", "base_url": f"http://rebind.test:{port}/v1", "model": "m"}
        made = fleet.submit("globex", {"kind": "chat", "model": model})
        assert made.status_code == 201, made.text
        run = fleet.finish("globex", made.json()["id"])
        assert private.requests == []
    assert run["status"] == "failed" and "loopback" in str(run["error"]), run


# --- 6. poison runs retry forever -------------------------------------------------------------

CALC = {"expression": "1+1"}
POISON: dict[str, list[Any]] = {
    "an id repeated in a reply": [
        {"tool_calls": [_call("calculator", CALC, "dup"), _call("calculator", CALC, "dup")]}
    ],
    "an id repeated across rounds": [
        {"tool_calls": [_call("calculator", CALC, "c1")]},
        {"tool_calls": [_call("calculator", CALC, "c1")]},
    ],
    "an id over 128 characters": [{"tool_calls": [_call("calculator", CALC, "x" * 200)]}],
    "NUL in a tool name": [{"tool_calls": [_call("calcu\x00lator", CALC, "c1")]}],
    "NUL in an id": [{"tool_calls": [_call("calculator", CALC, "c\x001")]}],
}


def test_6_poison_replies_end_the_run_within_one_round(fleet: Fleet) -> None:
    """A reply the store would refuse no longer makes the round retry forever: its ids are
    made storable and unique in the run (a reused id is renamed), NUL is dropped, and the run
    goes on — every request the strict fake server saw was valid, none repeated."""
    fleet.start()
    for what, replies in POISON.items():
        with FakeLLMServer(_by_round(*replies, "done")) as llm:
            made = fleet.submit("globex", _agent(llm, tools=["calculator"]))
            run = fleet.finish("globex", made.json()["id"], 30)
            time.sleep(0.3)
            asked = len(llm.requests)
        assert run["status"] == "completed", (what, run)
        assert asked == len(replies) + 1, (what, asked)  # no round was asked twice
        calls = fleet.api.get(
            f"/v1/runs/{run['id']}/tool-calls", headers=fleet.headers("globex")
        ).json()["tool_calls"]
        ids = [c["id"] if "id" in c else c["call_id"] for c in calls]
        assert len(ids) == len(set(ids)), (what, ids)
        assert all(len(i) <= 128 and "\x00" not in i for i in ids), (what, ids)
    with FakeLLMServer(_by_round({"text": "fine\x00", "reasoning": "th\x00ink"})) as llm:
        run = fleet.finish("globex", fleet.submit("globex", _agent(llm)).json()["id"], 30)
    assert run["status"] == "completed" and run["result"]["text"] == "fine"  # NUL dropped
    for profile in ({"name": "bad\x00name"}, {"pricing": {"tiers": [{"input": -1.0}]}}):
        with FakeLLMServer() as llm:
            got = fleet.submit("globex", {"kind": "chat", "model": _model(llm, **profile)})
        assert got.status_code == 422, got.text


# --- 7. 500s on hostile input, some after a commit ------------------------------------------


def test_7_hostile_bodies_answer_4xx_and_write_nothing(fleet: Fleet) -> None:
    globex = fleet.headers("globex")
    before = _row_counts(fleet.rt)
    for what, path, body in EDGE:
        got = fleet.api.post(
            path, content=body.encode(), headers={**globex, "content-type": "application/json"}
        )
        assert 400 <= got.status_code < 500, (what, got.status_code, got.text[:200])
    for path in ("/v1/runs/%00/usage", "/langgraph/threads/%00"):
        assert fleet.api.get(path, headers=globex).status_code == 422
    history = fleet.api.post(
        "/langgraph/threads/abc/history", json={"limit": "abc"}, headers=globex
    )
    assert history.status_code == 422
    assert _row_counts(fleet.rt) == before
    assert fleet.api.get("/v1/runs", headers=globex).status_code == 200


# --- 8. the low-to-medium findings ----------------------------------------------------------


def test_8_facades_check_the_key_before_the_body_and_write_nothing(fleet: Fleet) -> None:
    before = _row_counts(fleet.rt)
    for path in ("/openai/v1/responses", "/langgraph/runs", "/langgraph/threads"):
        got = fleet.api.post(
            path, content=b"[" * 5000, headers={"content-type": "application/json"}
        )
        assert got.status_code == 401, (path, got.text)
    globex = fleet.headers("globex")
    for path, body in (
        ("/openai/v1/responses", {"model": "nope", "input": "hi"}),
        ("/openai/v1/responses", {"model": "demo", "input": "x" * 250_000}),
        ("/langgraph/runs", {"assistant_id": "nope", "input": {}}),
    ):
        got = fleet.api.post(path, json=body, headers=globex)
        assert 400 <= got.status_code < 500, (path, got.text)
    assert _row_counts(fleet.rt) == before


def test_8_resume_tokens_are_never_stored_in_clear(fleet: Fleet) -> None:
    fleet.start()
    ask = {"question": "Which city?", "options": ["Paris", "Rome"]}
    replies = [{"tool_calls": [_call("ask_user", ask, "ask1")]}, "Booked."]
    with FakeLLMServer(_by_round(*replies)) as llm, Receiver() as hook:
        made = fleet.submit("acme", _agent(llm, ask=True), webhook={"url": hook.url})
        run_id = made.json()["id"]
        wait_for(
            lambda: [r for r in hook.received if r.json["type"] == "run.waiting"], 30, what="hook"
        )
        [waiting] = [r.json for r in hook.received if r.json["type"] == "run.waiting"]
        token = waiting["data"]["resume"]["token"]
        assert token.startswith("rtk_") and token not in _all_text(fleet.rt)
        answered = fleet.api.post(
            f"/v1/runs/{run_id}/answer",
            json={"ask_id": "ask1", "answers": ["Paris"]},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert answered.status_code == 200, answered.text
        assert fleet.finish("acme", run_id)["status"] == "completed"


def test_8_webhooks_tenants_and_metrics(fleet: Fleet) -> None:
    globex = fleet.headers("globex")
    before = _row_counts(fleet.rt)
    blocked = fleet.submit(
        "globex", {"kind": "chat", "model": OPERATOR}, webhook={"url": "http://10.0.0.1/h"}
    )
    assert blocked.status_code == 403 and "webhook.url" in blocked.text
    tools = [{"name": f"t{i}", "http": {"url": "https://93.184.216.34/"}} for i in range(40)]
    many = {"kind": "agent", "model": OPERATOR, "tools": [*tools, {"name": "sub", "agent": {
        "kind": "agent", "model": OPERATOR, "tools": tools}}]}  # fmt: skip
    assert fleet.submit("globex", many).status_code == 413
    prompt = {"kind": "chat", "model": OPERATOR, "system_prompt": "p" * 200_000}
    assert fleet.submit("globex", prompt).status_code == 413
    for budget in ({"deadline_s": -1}, {"deadline_s": 10**9}, {"max_cost": -3}):
        agent = {"kind": "chat", "model": OPERATOR, "budget": budget}
        assert fleet.submit("globex", agent).status_code == 422, budget
    assert _row_counts(fleet.rt) == before
    with fleet.rt.engine.begin() as conn, pytest.raises(SpecError, match="reserved"):
        keys.create_key(conn, "default")
    public = fleet.api.get("/metrics", headers=globex).text
    assert "treadle_runs{" not in public and "treadle_tenant_runs" not in public


def test_8_a_tenants_langgraph_webhook_is_signed_with_its_own_secret(fleet: Fleet) -> None:
    fleet.start()
    globex = fleet.headers("globex")
    with Receiver() as hook:
        thread = fleet.api.post("/langgraph/threads", json={}, headers=globex).json()
        run = fleet.api.post(
            f"/langgraph/threads/{thread['thread_id']}/runs/wait",
            json={
                "assistant_id": "demo-chat",
                "input": {"messages": [{"role": "user", "content": "hi"}]},
                "webhook": hook.url,
            },
            headers=globex,
        )
        assert run.status_code == 200, run.text
        [sent] = wait_for(lambda: hook.received, 30, what="the LangGraph webhook")
    verified = Webhook(tenant_secret(HOOK_SECRET, "globex")).verify(sent.body, sent.headers)
    assert verified["thread_id"] == thread["thread_id"]
    assert "webhook-signature" in sent.headers


# --- 9. a hostile MCP server ---------------------------------------------------------------------


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _victim_seconds(fleet: Fleet, llm: FakeLLMServer, n: int = 3) -> float:
    """The median time of ``n`` of the victim's one-round runs, one after the other."""
    took = []
    for _ in range(n):
        started = time.monotonic()
        made = fleet.submit("acme", {"kind": "chat", "model": _model(llm)}).json()
        assert fleet.finish("acme", made["id"], 60)["status"] == "completed"
        took.append(time.monotonic() - started)
    return sorted(took)[n // 2]


def _mcp_agent(llm: FakeLLMServer, urls: list[str], **kw: Any) -> dict[str, Any]:
    servers = [{"name": f"s{i}", "url": url} for i, url in enumerate(urls)]
    return {**_agent(llm), "mcp": servers, **kw}


def test_9_a_hostile_mcp_server_costs_only_its_own_runs(fleet: Fleet) -> None:
    """A minute-long listing, sixteen of them in one run, a thousand tools, schemas nested 40
    deep, a 10 MB result: each hostile run ends within its deadline, trimmed or with a clear
    error, and the other tenant's runs take at most twice their time alone meanwhile."""
    fleet.start(concurrency=4)
    with (
        FakeLLMServer() as good,
        HostileMcp(tools=3, list_delay=60) as slow,
        HostileMcp(tools=1000) as many,
        HostileMcp(tools=3, depth=40) as deep,
        HostileMcp(tools=1, result_bytes=10_000_000) as huge,
        FakeLLMServer(_by_round({"tool_calls": [_call("tool_0", {}, "big")]}, "done")) as bad,
    ):
        _victim_seconds(fleet, good, 1)  # the worker warms up
        alone = _victim_seconds(fleet, good)
        slow_urls = [f"{slow.url}?n={i}" for i in range(16)]
        hostile = [
            fleet.submit("globex", _mcp_agent(bad, slow_urls, budget={"deadline_s": 5}))
            for _ in range(4)
        ]
        hostile += [
            fleet.submit("globex", _mcp_agent(bad, [many.url])),
            fleet.submit("globex", _mcp_agent(bad, [deep.url])),
            fleet.submit("globex", _mcp_agent(bad, [huge.url])),
        ]
        assert all(h.status_code == 201 for h in hostile), [h.text for h in hostile]
        started = time.monotonic()
        wait_for(lambda: slow.requests("tools/list") >= 1, 20, what="a slow listing")
        meanwhile = _victim_seconds(fleet, good)
        ended = [fleet.finish("globex", h.json()["id"], 60) for h in hostile]
        hostile_s = time.monotonic() - started
        requests = list(bad.bodies)
    print(f"victim run {meanwhile:.2f}s while attacked, {alone:.2f}s alone")
    assert meanwhile <= 2 * alone + 0.2, f"victim {meanwhile:.2f}s, alone {alone:.2f}s"
    assert hostile_s < 30, f"the hostile runs took {hostile_s:.1f}s (deadlines of 5 s)"
    assert all(r["status"] in ("completed", "failed") for r in ended), ended
    globex = fleet.headers("globex")
    events = [fleet.api.get(f"/v1/runs/{r['id']}/events", headers=globex).text for r in ended[:4]]
    assert any("tool.unavailable" in e and "did not list its tools within" in e for e in events)
    assert max(len(b.get("tools") or []) for b in requests) <= 64  # 1,000 listed, 64 sent
    assert max(len(json.dumps(b)) for b in requests) < 3_000_000
    calls = fleet.api.get(f"/v1/runs/{ended[-1]['id']}/tool-calls", headers=globex).json()
    [big] = calls["tool_calls"]
    assert "too large" in str(big["result"])


def test_9_two_hundred_mcp_urls_leave_the_workers_memory_bounded(fleet: Fleet) -> None:
    """Each distinct URL's tool list is cached per process, in a byte-bounded cache: after
    200 distinct URLs (64 tools each, 2 KB descriptions) the worker holds within 50 MB of what
    it held before them. Before: once its caches are full (100 distinct URLs: on this machine
    the worker grows ~45 MB over them, then stays flat within ~10 MB over 600 more)."""
    pid = fleet.start(concurrency=8)
    with HostileMcp(tools=64, description_bytes=2_000) as mcp, FakeLLMServer() as llm:

        def runs(first: int, n: int) -> None:
            # in waves the worker's listing limits admit (a tenant's two waiters, 64 listings
            # in flight), so that every URL is listed and cached: the memory is the point here
            for wave in range(first, first + n, 16):
                made = [
                    fleet.submit("globex", _mcp_agent(llm, [f"{mcp.url}?u={i}"])).json()["id"]
                    for i in range(wave, min(wave + 16, first + n))
                ]
                for run_id in made:
                    assert fleet.finish("globex", run_id, 120)["status"] == "completed"
            wait_for(lambda: mcp.requests("tools/list") >= first + n, 30, what="every listing")

        runs(0, 100)  # warm: pools, imports, the bounded caches filled
        before = _rss_mb(pid)
        runs(100, 200)
        after = _rss_mb(pid)
    print(f"worker RSS {before:.0f} MB -> {after:.0f} MB after 200 MCP URLs")
    assert after - before <= 50, f"worker RSS {before:.0f} MB -> {after:.0f} MB"
