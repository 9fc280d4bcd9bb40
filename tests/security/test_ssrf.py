"""SSRF through a run: an inline HTTP tool in an agent spec, called by
the model, may not reach 127.0.0.1, ::1, 169.254.169.254, 10.x, a name resolving to loopback, or
be redirected to loopback — the tool call ends as a tool error and nothing is sent. Also: size
and time caps, headers only from env var names, arguments never reach a shell."""

from __future__ import annotations

import ast
import json
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from scheduler.app import create_app
from shared.agent.spec import ModelProfile
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.errors import FatalModelError
from shared.llm.fake_server import FakeLLMServer
from shared.llm.profiles import close_http_clients, make_model
from shared.store import calls as call_store
from shared.store import runs as run_store
from shared.tools.netguard import check_url
from tests.engine.helpers import agent, call, submit
from tests.llm.helpers import request
from tests.security.conftest import with_settings
from tests.tools.conftest import FakeDns, LocalServer

ROOT = Path(__file__).resolve().parents[2]


def _fetch_spec(url: str, args: dict[str, Any] | None = None, **http: Any) -> Any:
    tool = {
        "name": "fetch",
        "read_only": True,
        "parameters": {"type": "object", "properties": {}},
        "http": {"method": "GET", "url": url, **http},
    }
    return agent(
        [{"tool_calls": [call("fetch", args or {}, "c1")]}, {"text": "done"}], tools=[tool]
    )


def _tool_result(rt: Runtime, stub: StubBroker, spec: Any) -> str:
    """Run the spec to its end; the text of its one tool call's result."""
    run_id = submit(rt, spec)
    stub.drain(rt)
    with rt.engine.connect() as conn:
        assert run_store.get_run(conn, run_id)["status"] == "completed"  # type: ignore[index]
        [c] = call_store.list_tool_calls(conn, run_id)
    return str(c["result"])


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://127.0.0.1:{port}/x", "loopback"),
        ("http://[::1]:{port}/x", "loopback"),
        ("http://169.254.169.254/latest/meta-data/", "cloud metadata"),
        ("http://10.0.0.1/x", "private"),
        ("http://10.255.1.2:8080/admin", "private"),
        ("http://localhost:{port}/x", "loopback"),
    ],
)
def test_internal_addresses_are_refused(
    sqlite_rt: Runtime, stub: StubBroker, server: LocalServer, url: str, reason: str
) -> None:
    result = _tool_result(sqlite_rt, stub, _fetch_spec(url.format(port=server.port)))
    assert result.startswith("Tool error: blocked URL") and f"({reason} address" in result
    assert server.requests == []


def test_a_name_resolving_to_loopback_is_refused(
    sqlite_rt: Runtime, stub: StubBroker, server: LocalServer, fake_dns: FakeDns
) -> None:
    fake_dns({"innocent.example": ["127.0.0.1"], "six.example": ["::1"]})
    for host in ("innocent.example", "six.example"):
        result = _tool_result(sqlite_rt, stub, _fetch_spec(f"http://{host}:{server.port}/x"))
        assert f"blocked URL: {host} resolves to" in result and "(loopback address" in result
    assert server.requests == []


def test_a_redirect_to_loopback_is_refused(
    sqlite_rt: Runtime, stub: StubBroker, server: LocalServer, other_server: LocalServer
) -> None:
    rt = with_settings(sqlite_rt, allow_hosts=server.host_port)  # the first hop is allowed
    for target in (
        other_server.url("/secret"),
        f"http://localhost:{server.port}/secret",
        "http://169.254.169.254/latest/meta-data/",
    ):
        result = _tool_result(rt, stub, _fetch_spec(server.url(f"/redirect?to={target}")))
        assert result.startswith("Tool error: blocked URL"), result
    assert [r.path for r in server.requests] == ["/redirect"] * 3
    assert other_server.requests == []


def test_allow_listed_host_is_reached(
    sqlite_rt: Runtime, stub: StubBroker, server: LocalServer
) -> None:
    rt = with_settings(sqlite_rt, allow_hosts=server.host_port)
    result = _tool_result(rt, stub, _fetch_spec(server.url("/echo")))
    assert json.loads(result)["path"] == "/echo"


def test_response_size_and_time_caps(
    sqlite_rt: Runtime, stub: StubBroker, server: LocalServer
) -> None:
    rt = with_settings(sqlite_rt, allow_hosts=server.host_port)
    big = _tool_result(rt, stub, _fetch_spec(server.url("/stream?n=2000000")))
    assert "response too large (limit 1000000 bytes)" in big
    slow = _tool_result(rt, stub, _fetch_spec(server.url("/slow?delay=0.2"), timeout_s=0.5))
    assert "timed out after 0.5s" in slow


def test_headers_come_only_from_env_var_names(
    sqlite_rt: Runtime, stub: StubBroker, server: LocalServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    with TestClient(create_app(lambda: sqlite_rt)) as api:  # literal headers: unknown field
        spec = {
            "kind": "agent",
            "model": "demo",
            "tools": [
                {
                    "name": "t",
                    "http": {
                        "url": "https://93.184.216.34/",
                        "headers": {"Authorization": "Bearer x"},
                    },
                }
            ],
        }
        got = api.post("/v1/runs", json={"agent": spec, "input": "hi"})
        assert got.status_code == 422 and "headers" in got.text
    monkeypatch.setenv("TREADLE_TEST_TOOL_TOKEN", "tok-123")
    rt = with_settings(sqlite_rt, allow_hosts=server.host_port)
    result = _tool_result(
        rt,
        stub,
        _fetch_spec(server.url("/echo"), headers_env={"X-Token": "TREADLE_TEST_TOOL_TOKEN"}),
    )
    assert json.loads(result)["headers"]["x-token"] == "tok-123"  # read at call time
    monkeypatch.delenv("TREADLE_TEST_TOOL_TOKEN")
    missing = _tool_result(
        rt,
        stub,
        _fetch_spec(server.url("/echo"), headers_env={"X-Token": "TREADLE_TEST_TOOL_TOKEN"}),
    )
    assert "TREADLE_TEST_TOOL_TOKEN (header X-Token) is not set" in missing


def test_arguments_are_data_never_commands(
    sqlite_rt: Runtime, stub: StubBroker, server: LocalServer, tmp_path: Path
) -> None:
    rt = with_settings(sqlite_rt, allow_hosts=server.host_port)
    marker = tmp_path / "pwned"
    hostile = f"$(touch {marker}); `touch {marker}` | touch {marker} && __import__('os')"
    spec = _fetch_spec(server.url("/items/{name}"), {"name": hostile, "q": hostile})
    result = json.loads(_tool_result(rt, stub, spec))
    assert result["query"]["q"] == [hostile]  # sent verbatim, URL-encoded
    assert not marker.exists()
    [req] = server.requests
    assert "touch" in req.path  # the placeholder was quoted into the path, not run


def test_the_http_tool_path_has_no_shell_or_eval() -> None:
    banned_calls = {
        "eval",
        "exec",
        "system",
        "popen",
        "Popen",
        "check_output",
        "check_call",
        "getoutput",
        "spawn",
        "execv",
        "execve",
    }
    for rel in ("shared/tools/http_tool.py", "shared/tools/netguard.py"):
        tree = ast.parse((ROOT / rel).read_text())
        imported = {
            a.name.split(".")[0]
            for n in ast.walk(tree)
            if isinstance(n, ast.Import | ast.ImportFrom)
            for a in n.names
        }
        imported |= {
            n.module.split(".")[0]
            for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and n.module
        }
        assert not imported & {"subprocess", "os", "pty", "shlex"}, rel
        names = {
            n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
            for n in ast.walk(tree)
            if isinstance(n, ast.Call)
        }
        assert not names & banned_calls, (rel, names & banned_calls)


def _rebinding_dns(monkeypatch: pytest.MonkeyPatch, first: str, then: str | None) -> list[str]:
    """``rebind.test`` answers ``first`` once, then ``then`` (None: no answer at all)."""
    real = socket.getaddrinfo
    lookups: list[str] = []

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host != "rebind.test":
            return real(host, port, *args, **kwargs)
        lookups.append(host)
        address = first if len(lookups) == 1 else then
        if address is None:
            raise socket.gaierror("rebound")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, int(port or 0)))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return lookups


def test_a_tenant_model_endpoint_cannot_be_rebound_to_a_private_address(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Checked public at submit, loopback when the worker connects: the worker's client
    checks again at connect time and refuses; nothing reaches the private server."""
    with FakeLLMServer() as llm:
        port = httpx.URL(llm.base_url).port
        _rebinding_dns(monkeypatch, "93.184.216.34", "127.0.0.1")
        profile = ModelProfile(base_url=f"http://rebind.test:{port}/v1", model="m")
        check_url(profile.base_url)  # what the API checks at submit: a public address
        with pytest.raises(FatalModelError, match="loopback"):
            make_model(profile, tenant="acme", allow_hosts="").complete(request())
        assert llm.requests == []
        close_http_clients()


def test_a_tenant_model_endpoint_is_pinned_to_the_address_it_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One lookup per connection: the address checked is the address connected to (a second
    lookup, the rebinding window, would fail here)."""
    with FakeLLMServer() as llm:
        port = httpx.URL(llm.base_url).port
        lookups = _rebinding_dns(monkeypatch, "127.0.0.1", None)
        profile = ModelProfile(base_url=f"http://rebind.test:{port}/v1", model="m")
        model = make_model(profile, tenant="acme", allow_hosts=f"rebind.test:{port}")
        assert model.complete(request()).text.startswith("echo")
        assert lookups == ["rebind.test"]
        assert llm.requests[0].headers["host"] == f"rebind.test:{port}"
        close_http_clients()


def test_operator_endpoints_and_keyless_runs_are_trusted(monkeypatch: pytest.MonkeyPatch) -> None:
    with FakeLLMServer() as llm:
        profile = ModelProfile(base_url=llm.base_url, model="m")  # 127.0.0.1, not allowed
        with pytest.raises(FatalModelError, match="loopback"):
            make_model(profile, tenant="acme", allow_hosts="").complete(request())
        assert make_model(profile.as_operator(), tenant="acme").complete(request()).text
        assert make_model(profile, tenant="default").complete(request()).text  # auth off
        close_http_clients()
