"""Limits: body size (also chunked), input length, tools per spec, runs in flight per
tenant, submissions per minute per key — 413 or 429 with Retry-After, and nothing written. With
auth required, a tenant's spec may name only allowed env vars and public model hosts."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from scheduler.app import create_app
from shared.agent.spec import ModelProfile
from shared.config import Settings
from shared.engine.runtime import Runtime
from shared.store import runs as run_store
from tests.security.conftest import MakeKey, bearer, row_counts, with_settings

CHAT = {"kind": "chat", "model": "demo"}


@pytest.fixture
def limited(secure_rt: Runtime) -> Runtime:
    return with_settings(
        secure_rt, max_input_chars=1000, max_tools=3, max_runs_in_flight=2, submits_per_minute=4
    )


@pytest.fixture
def client(limited: Runtime) -> Iterator[TestClient]:
    with TestClient(create_app(lambda: limited)) as c:
        yield c


def _submit(client: TestClient, key: str, **body: Any) -> Any:
    return client.post("/v1/runs", json={"agent": CHAT, "input": "hi", **body}, headers=bearer(key))


def test_body_over_2mb_is_413_with_or_without_content_length(
    client: TestClient, limited: Runtime, make_key: MakeKey
) -> None:
    key, before = make_key("acme"), row_counts(limited)
    big = b'{"agent": "demo", "input": "' + b"x" * 2_100_000 + b'"}'
    got = client.post(
        "/v1/runs", content=big, headers={**bearer(key), "content-type": "application/json"}
    )
    assert got.status_code == 413 and got.json()["error"]["code"] == "too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        yield big[:1_000_000]
        yield big[1_000_000:]

    got = client.post(
        "/v1/runs", content=chunks(), headers={**bearer(key), "content-type": "application/json"}
    )
    assert got.status_code == 413 and "2 MB" in got.json()["error"]["message"]
    assert row_counts(limited) == before


def test_input_length_and_tool_count(
    client: TestClient, limited: Runtime, make_key: MakeKey
) -> None:
    key, before = make_key("acme"), row_counts(limited)
    long_input = _submit(client, key, input="x" * 1001)
    assert long_input.status_code == 413
    assert "TREADLE_MAX_INPUT_CHARS" in long_input.json()["error"]["message"]
    as_messages = _submit(client, key, input=[{"role": "user", "content": "y" * 1001}])
    assert as_messages.status_code == 413
    tools = {
        "kind": "agent",
        "model": "demo",
        "tools": ["calculator", "current_time", "http_get", "stop"],
    }
    too_many = client.post("/v1/runs", json={"agent": tools, "input": "hi"}, headers=bearer(key))
    assert too_many.status_code == 413 and "TREADLE_MAX_TOOLS" in too_many.text
    assert row_counts(limited) == before


def test_runs_in_flight_per_tenant(client: TestClient, limited: Runtime, make_key: MakeKey) -> None:
    a, b = make_key("acme"), make_key("globex")
    first = _submit(client, a).json()["id"]
    assert _submit(client, a).status_code == 201
    before = row_counts(limited)
    third = _submit(client, a)
    assert third.status_code == 429 and third.json()["error"]["code"] == "too_many_runs"
    assert int(third.headers["retry-after"]) >= 1
    assert row_counts(limited) == before
    assert _submit(client, b).status_code == 201  # another tenant has its own count
    client.post(f"/v1/runs/{first}/cancel", headers=bearer(a))
    assert _submit(client, a).status_code == 201


def test_an_idempotent_replay_is_not_a_new_run(client: TestClient, make_key: MakeKey) -> None:
    a = make_key("acme")
    headers = {**bearer(a), "Idempotency-Key": "k1"}
    made = client.post("/v1/runs", json={"agent": CHAT, "input": "hi"}, headers=headers)
    _submit(client, a)
    again = client.post("/v1/runs", json={"agent": CHAT, "input": "hi"}, headers=headers)
    assert (made.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == made.json()["id"]


def test_submissions_per_minute_per_key(secure_rt: Runtime, make_key: MakeKey) -> None:
    rt = with_settings(secure_rt, submits_per_minute=3)
    a, a2 = make_key("acme"), make_key("acme")
    with TestClient(create_app(lambda: rt)) as client:
        for _ in range(3):
            assert _submit(client, a).status_code == 201
        before = row_counts(rt)
        over = _submit(client, a)
        assert over.status_code == 429 and over.json()["error"]["code"] == "rate_limited"
        assert 1 <= int(over.headers["retry-after"]) <= 60
        assert row_counts(rt) == before
        assert _submit(client, a2).status_code == 201  # per key


def _profile(**kw: Any) -> dict[str, Any]:
    return {
        "kind": "chat",
        "model": {"provider": "openai", "base_url": "https://93.184.216.34/v1", "model": "m", **kw},
    }


def test_a_tenant_spec_names_only_allowed_env_vars(
    secure_rt: Runtime, make_key: MakeKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = make_key("acme")
    with TestClient(create_app(lambda: secure_rt)) as client:
        before = row_counts(secure_rt)
        for agent, hook in [
            (_profile(api_key_env="TREADLE_DATABASE_URL"), None),
            (
                {
                    "kind": "agent",
                    "model": "demo",
                    "tools": [
                        {
                            "name": "t",
                            "http": {
                                "url": "https://93.184.216.34/x",
                                "headers_env": {"X-Key": "AWS_SECRET"},
                            },
                        }
                    ],
                },
                None,
            ),
            (CHAT, {"url": "https://93.184.216.34/hook", "secret_env": "HOME"}),
        ]:
            got = client.post(
                "/v1/runs",
                json={"agent": agent, "input": "hi", "webhook": hook},
                headers=bearer(key),
            )
            assert got.status_code == 403 and "TREADLE_SPEC_ENV_ALLOW" in got.text, got.text
        private = client.post(
            "/v1/runs",
            json={
                "agent": {
                    "kind": "chat",
                    "model": {
                        "provider": "openai",
                        "base_url": "http://169.254.169.254/",
                        "model": "m",
                    },
                },
                "input": "hi",
            },
            headers=bearer(key),
        )
        assert private.status_code == 403 and "cloud metadata" in private.text
        assert row_counts(secure_rt) == before
    allowed = with_settings(secure_rt, spec_env_allow="ACME_*,HOOK_SECRET")
    with TestClient(create_app(lambda: allowed)) as client:
        ok = client.post(
            "/v1/runs",
            json={
                "agent": _profile(api_key_env="ACME_OPENAI_KEY"),
                "input": "hi",
                "webhook": {"url": "https://93.184.216.34/h", "secret_env": "HOOK_SECRET"},
            },
            headers=bearer(key),
        )
        assert ok.status_code == 201, ok.text


def test_test_models_are_refused_unless_the_operator_allows_them(
    secure_rt: Runtime, make_key: MakeKey
) -> None:
    scripted = {"provider": "scripted", "replies": [{"sleep": 40, "text": "held"}]}
    nested = {
        "kind": "agent",
        "model": "demo",
        "tools": [{"name": "helper", "agent": {"kind": "chat", "model": scripted}}],
    }
    key = make_key("acme")
    closed = with_settings(secure_rt, allow_test_models=False)
    with TestClient(create_app(lambda: closed)) as client:
        before = row_counts(closed)
        for agent in ({"kind": "chat", "model": scripted}, nested):
            got = client.post("/v1/runs", json={"agent": agent, "input": "hi"}, headers=bearer(key))
            assert got.status_code == 422 and "TREADLE_ALLOW_TEST_MODELS" in got.text, got.text
        assert row_counts(closed) == before
        registered = client.post(  # the operator's own agent may use it
            "/v1/runs", json={"agent": "demo-assistant", "input": "hi"}, headers=bearer(key)
        )
        assert registered.status_code == 201, registered.text
    assert Settings(broker_url="memory://", allow_test_models=None).test_models_allowed
    assert not Settings(broker_url="redis://r:6379/0", allow_test_models=None).test_models_allowed
    assert Settings(broker_url="redis://r:6379/0", allow_test_models=True).test_models_allowed


def test_timeouts_retries_and_budgets_are_bounded(secure_rt: Runtime, make_key: MakeKey) -> None:
    """Out of range (negative, non-finite) → 422 from the spec; above the operator's maximum
    → 422 naming the setting; nothing written either way."""
    key = make_key("acme")
    rt = with_settings(secure_rt, spec_max_deadline_s=60, spec_max_model_timeout_s=30)
    public = {"provider": "openai", "base_url": "https://93.184.216.34/v1", "model": "m"}
    hostile: list[tuple[dict[str, Any], str]] = [
        ({"kind": "chat", "budget": {"deadline_s": 3600}}, "TREADLE_SPEC_MAX_DEADLINE_S"),
        ({"kind": "chat", "budget": {"deadline_s": -1}}, "greater than 0"),
        ({"kind": "chat", "budget": {"max_cost": -5}}, "greater than or equal to 0"),
        ({"kind": "chat", "model": {**public, "timeout_read": 9999}}, "MODEL_TIMEOUT_S"),
        ({"kind": "chat", "model": {**public, "max_retries": 1000}}, "MODEL_RETRIES"),
        ({"kind": "chat", "model": {**public, "max_retries": -1}}, "greater than or equal"),
        ({"kind": "chat", "ask_timeout_s": 10**9}, "ASK_TIMEOUT_S"),
        (
            {"kind": "chat", "model": {**public, "pricing": {"tiers": [{"input": -1}]}}},
            "greater than or equal to 0",
        ),
        (
            {
                "kind": "agent",
                "model": "demo",
                "tools": [
                    {"name": "t", "http": {"url": "https://93.184.216.34/", "timeout_s": 1e6}}
                ],
            },
            "TOOL_TIMEOUT_S",
        ),
        (
            {
                "kind": "agent",
                "model": "demo",
                "tools": [
                    {"name": "helper", "agent": {"kind": "chat", "budget": {"deadline_s": 999}}}
                ],
            },
            "TREADLE_SPEC_MAX_DEADLINE_S",
        ),
    ]
    with TestClient(create_app(lambda: rt)) as client:
        before = row_counts(rt)
        for agent, why in hostile:
            got = client.post("/v1/runs", json={"agent": agent, "input": "x"}, headers=bearer(key))
            assert got.status_code == 422 and why in got.text, (agent, got.text)
        nan = client.post(
            "/v1/runs",
            content=b'{"agent": {"kind": "chat", "budget": {"max_cost": NaN}}, "input": "x"}',
            headers={**bearer(key), "content-type": "application/json"},
        )
        assert nan.status_code == 422, nan.text
        assert row_counts(rt) == before
        ok = {"kind": "chat", "budget": {"deadline_s": 60}, "model": {**public, "timeout_read": 30}}
        got = client.post("/v1/runs", json={"agent": ok, "input": "x"}, headers=bearer(key))
        assert got.status_code == 201, got.text
    with rt.engine.connect() as conn:
        stored = run_store.get_run(conn, got.json()["id"], "acme")
    assert stored is not None
    model = stored["agent"]["model"]  # defaults over a maximum are lowered to it
    assert (model["timeout_read"], model["timeout_total"], model["timeout_connect"]) == (30, 30, 10)


def test_an_inline_profile_cannot_take_an_operator_profile_name(
    secure_rt: Runtime, make_key: MakeKey
) -> None:
    operator = ModelProfile(name="shared-gpt", base_url="https://93.184.216.34/v1").as_operator()
    rt = Runtime(
        engine=secure_rt.engine,
        settings=secure_rt.settings,
        publish=secure_rt.publish,
        profiles={"shared-gpt": operator},
    )
    key = make_key("acme")
    with TestClient(create_app(lambda: rt)) as client:
        before = row_counts(rt)
        for name in ("shared-gpt", "demo"):
            model = {"name": name, "base_url": "https://93.184.216.34/v1", "model": "m"}
            got = client.post(
                "/v1/runs",
                json={"agent": {"kind": "chat", "model": model}, "input": "x"},
                headers=bearer(key),
            )
            assert got.status_code == 422 and "operator's model profile" in got.text, got.text
        assert row_counts(rt) == before
        by_name = client.post(  # naming it is how a tenant uses it
            "/v1/runs",
            json={"agent": {"kind": "chat", "model": "shared-gpt"}, "input": "x"},
            headers=bearer(key),
        )
        assert by_name.status_code == 201, by_name.text


def test_a_blocked_webhook_url_is_refused_at_submit(secure_rt: Runtime, make_key: MakeKey) -> None:
    key = make_key("acme")
    with TestClient(create_app(lambda: secure_rt)) as client:
        before = row_counts(secure_rt)
        for url in ("http://127.0.0.1:9/h", "http://169.254.169.254/", "http://10.0.0.7/hook"):
            got = client.post(
                "/v1/runs",
                json={"agent": CHAT, "input": "x", "webhook": {"url": url}},
                headers=bearer(key),
            )
            assert got.status_code == 403 and "webhook.url" in got.text, got.text
        assert row_counts(secure_rt) == before


# --- sandboxes bounded as a group -------------------------------------------------


@pytest.fixture
def sandboxes() -> Iterator[Any]:
    """A ``Confinement`` of its own cgroup parent (this test's), removed afterwards; skipped
    without bubblewrap or writable cgroups."""
    import uuid

    from shared.tools import cgroups, sandbox
    from shared.tools.confinement import Confinement
    from tests.support import need_service

    reason = sandbox.unavailable_reason()
    found = cgroups.detect()
    if reason or isinstance(found, str):
        need_service("bubblewrap and cgroups", RuntimeError(reason or str(found)))
    assert not isinstance(found, str)
    parent = f"treadle-test-{uuid.uuid4().hex[:8]}"
    settings = Settings(
        sandbox_cgroup=parent,
        sandbox_group_memory_mb=1024,
        sandbox_memory_mb=2048,  # each sandbox may ask more than the group holds
        sandbox_slots=16,
    )
    confinement = Confinement.from_settings(settings, found)
    yield confinement
    assert confinement.groups is not None
    confinement.groups.close()
    cgroups.Cgroup(found.version, found.roots).child(parent).remove()


def _run_python(confinement: Any, code: str, tenant: str = "acme") -> Any:
    from shared.tools import ToolContext
    from shared.tools.sandbox import RunPythonArgs, run_python

    ctx = ToolContext(run_id="run_1", call_id="c", tenant=tenant, confinement=confinement)
    return run_python(RunPythonArgs(code=code, timeout_s=20), ctx)


def test_sixteen_sandboxes_of_a_gigabyte_each_stay_within_the_group_limit(sandboxes: Any) -> None:
    """16 concurrent run_python, each allocating (and touching) 1 GB, under a 1 GB group:
    what they hold together stays within the group's limit — the kernel kills some — and the
    worker lives on."""
    import threading

    code = "b = bytearray(1024 ** 3)\nprint('allocated', len(b))\n"
    results: list[Any] = []
    threads = [
        threading.Thread(target=lambda: results.append(_run_python(sandboxes, code)))
        for _ in range(16)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(results) == 16
    peak = sandboxes.peak_memory()
    assert 0 < peak <= 1024 * 1024 * 1024, f"the sandboxes held {peak / 2**20:.0f} MB together"
    killed = [r for r in results if "allocated" not in r.text]
    assert len(killed) >= 8, [r.text[:100] for r in results]
    assert any("out of memory" in r.text for r in killed), [r.text[:300] for r in killed]


@pytest.mark.parametrize(
    "code",
    [
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
        "import subprocess, sys\n"
        "ps = [subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(5)'])"
        " for _ in range(64)]\n"
        "print('spawned', len(ps))\n",
    ],
    ids=["fork bomb", "64 processes"],
)
def test_a_fork_bomb_and_a_64_process_spawn_are_refused(sandboxes: Any, code: str) -> None:
    result = _run_python(sandboxes, code)
    assert "spawned 64" not in result.text
    assert result.data["exit_code"] != 0 or result.data["timed_out"] or result.data["killed"]
    if "subprocess" in code:
        assert "Resource temporarily unavailable" in result.text or "BlockingIOError" in result.text


def test_a_tenants_burst_waits_behind_itself_not_in_front_of_others() -> None:
    """The slots are shared round robin: with one slot taken, a tenant's three queued calls
    and another tenant's one are served alternately, not in arrival order."""
    import threading
    import time

    from shared.tools.slots import FairSlots

    slots = FairSlots(1)
    order: list[str] = []
    hold = threading.Event()

    def take(tenant: str) -> None:
        with slots.slot(tenant, timeout=10):
            order.append(tenant)
            hold.wait(10)

    first = threading.Thread(target=take, args=("globex",))
    first.start()
    time.sleep(0.1)
    waiters = []
    for tenant in ("globex", "globex", "globex", "acme"):
        waiters.append(threading.Thread(target=take, args=(tenant,)))
        waiters[-1].start()
        time.sleep(0.05)
    hold.set()
    for t in [first, *waiters]:
        t.join(10)
    assert order == ["globex", "globex", "acme", "globex", "globex"]


# --- quotas on what a tenant stores and schedules -----------------------------------


def test_the_n_plus_first_cron_agent_and_version_are_refused(
    secure_rt: Runtime, make_key: MakeKey
) -> None:
    rt = with_settings(
        secure_rt, max_crons=2, max_agents=2, max_agent_versions=2, cron_min_interval_s=300
    )
    acme, globex = make_key("acme"), make_key("globex")
    cron = {"agent": CHAT, "input": "tick", "schedule": "*/5 * * * *"}
    with TestClient(create_app(lambda: rt)) as client:
        for _ in range(2):
            assert client.post("/v1/crons", json=cron, headers=bearer(acme)).status_code == 201
        before = row_counts(rt)
        third = client.post("/v1/crons", json=cron, headers=bearer(acme))
        lg = client.post(
            "/langgraph/runs/crons",
            json={
                "assistant_id": "demo-chat",
                "schedule": "*/5 * * * *",
                "input": {"messages": [{"role": "user", "content": "tick"}]},
            },
            headers=bearer(acme),
        )
        often = client.post(
            "/v1/crons", json={**cron, "schedule": "* * * * *"}, headers=bearer(globex)
        )
        assert row_counts(rt) == before
        assert client.post("/v1/crons", json=cron, headers=bearer(globex)).status_code == 201
        agents = [
            client.post(
                "/v1/agents", json={"name": f"a{i}", "spec": CHAT}, headers=bearer(acme)
            ).status_code
            for i in range(3)
        ]
        versions = [
            client.put("/v1/agents/a0", json={"spec": CHAT}, headers=bearer(acme)).status_code
            for _ in range(2)
        ]
    assert third.status_code == 409 and third.json()["error"]["code"] == "quota_exceeded"
    assert "TREADLE_MAX_CRONS" in third.json()["error"]["message"]
    assert lg.status_code == 409, lg.text
    assert often.status_code == 422 and "TREADLE_CRON_MIN_INTERVAL_S" in often.text
    assert agents == [201, 201, 409]
    assert versions == [200, 409]  # version 2 is the most an agent may have


def test_pdf_readers_wait_for_the_workers_slots() -> None:
    """PDF readers take the sandboxes' slots: with the worker's one slot taken, a document
    waits for it (eight at once no longer run eight readers)."""
    import threading
    import time

    from shared.tools.confinement import Confinement
    from shared.tools.documents import extract
    from tests.files_support import tiny_pdf

    confinement = Confinement.from_settings(Settings(sandbox_slots=1), "no cgroups here")
    done: list[Any] = []

    def read() -> None:
        pdf = tiny_pdf([["hello"]])
        done.append(extract(pdf, "application/pdf", "a.pdf", None, None, confinement, "acme"))

    reader = threading.Thread(target=read)
    with confinement.slots.slot("globex"):
        reader.start()
        time.sleep(1.0)
        assert done == [] and confinement.slots.waiting() == 1
    reader.join(30)
    assert done and "hello" in done[0].text
