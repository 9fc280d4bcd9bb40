"""SSRF through a run (issue #11, acceptance 3): an inline HTTP tool in an agent spec, called by
the model, may not reach 127.0.0.1, ::1, 169.254.169.254, 10.x, a name resolving to loopback, or
be redirected to loopback — the tool call ends as a tool error and nothing is sent. Also: size
and time caps, headers only from env var names, arguments never reach a shell."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from scheduler.api import create_app
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.store import repo
from tests.engine.helpers import agent, call, submit
from tests.security.conftest import with_settings
from tests.tools.conftest import FakeDns, LocalServer

ROOT = Path(__file__).resolve().parents[2]


def _fetch_spec(url: str, args: dict[str, Any] | None = None, **http: Any) -> Any:
    tool = {"name": "fetch", "read_only": True,
            "parameters": {"type": "object", "properties": {}},
            "http": {"method": "GET", "url": url, **http}}
    return agent([{"tool_calls": [call("fetch", args or {}, "c1")]}, {"text": "done"}],
                 tools=[tool])


def _tool_result(rt: Runtime, stub: StubBroker, spec: Any) -> str:
    """Run the spec to its end; the text of its one tool call's result."""
    run_id = submit(rt, spec)
    stub.drain(rt)
    with rt.engine.connect() as conn:
        assert repo.get_run(conn, run_id)["status"] == "completed"  # type: ignore[index]
        [c] = repo.list_tool_calls(conn, run_id)
    return str(c["result"])


@pytest.mark.parametrize(("url", "reason"), [
    ("http://127.0.0.1:{port}/x", "loopback"),
    ("http://[::1]:{port}/x", "loopback"),
    ("http://169.254.169.254/latest/meta-data/", "cloud metadata"),
    ("http://10.0.0.1/x", "private"),
    ("http://10.255.1.2:8080/admin", "private"),
    ("http://localhost:{port}/x", "loopback"),
])
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
    for target in (other_server.url("/secret"), f"http://localhost:{server.port}/secret",
                   "http://169.254.169.254/latest/meta-data/"):
        result = _tool_result(rt, stub, _fetch_spec(server.url(f"/redirect?to={target}")))
        assert result.startswith("Tool error: blocked URL"), result
    assert [r.path for r in server.requests] == ["/redirect"] * 3
    assert other_server.requests == []


def test_allow_listed_host_is_reached(sqlite_rt: Runtime, stub: StubBroker,
                                      server: LocalServer) -> None:
    rt = with_settings(sqlite_rt, allow_hosts=server.host_port)
    result = _tool_result(rt, stub, _fetch_spec(server.url("/echo")))
    assert json.loads(result)["path"] == "/echo"


def test_response_size_and_time_caps(sqlite_rt: Runtime, stub: StubBroker,
                                     server: LocalServer) -> None:
    rt = with_settings(sqlite_rt, allow_hosts=server.host_port)
    big = _tool_result(rt, stub, _fetch_spec(server.url("/stream?n=2000000")))
    assert "response too large (limit 1000000 bytes)" in big
    slow = _tool_result(rt, stub, _fetch_spec(server.url("/slow?delay=0.2"), timeout_s=0.5))
    assert "timed out after 0.5s" in slow


def test_headers_come_only_from_env_var_names(
    sqlite_rt: Runtime, stub: StubBroker, server: LocalServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    with TestClient(create_app(lambda: sqlite_rt)) as api:  # literal headers: unknown field
        spec = {"kind": "agent", "model": "demo", "tools": [{"name": "t", "http": {
            "url": "https://93.184.216.34/", "headers": {"Authorization": "Bearer x"}}}]}
        got = api.post("/v1/runs", json={"agent": spec, "input": "hi"})
        assert got.status_code == 422 and "headers" in got.text
    monkeypatch.setenv("TREADLE_TEST_TOOL_TOKEN", "tok-123")
    rt = with_settings(sqlite_rt, allow_hosts=server.host_port)
    result = _tool_result(rt, stub, _fetch_spec(
        server.url("/echo"), headers_env={"X-Token": "TREADLE_TEST_TOOL_TOKEN"}))
    assert json.loads(result)["headers"]["x-token"] == "tok-123"  # read at call time
    monkeypatch.delenv("TREADLE_TEST_TOOL_TOKEN")
    missing = _tool_result(rt, stub, _fetch_spec(
        server.url("/echo"), headers_env={"X-Token": "TREADLE_TEST_TOOL_TOKEN"}))
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
    banned_calls = {"eval", "exec", "system", "popen", "Popen", "check_output", "check_call",
                    "getoutput", "spawn", "execv", "execve"}
    for rel in ("shared/tools/http_tool.py", "shared/tools/netguard.py"):
        tree = ast.parse((ROOT / rel).read_text())
        imported = {a.name.split(".")[0] for n in ast.walk(tree)
                    if isinstance(n, ast.Import | ast.ImportFrom) for a in n.names}
        imported |= {n.module.split(".")[0] for n in ast.walk(tree)
                     if isinstance(n, ast.ImportFrom) and n.module}
        assert not imported & {"subprocess", "os", "pty", "shlex"}, rel
        names = {n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
                 for n in ast.walk(tree) if isinstance(n, ast.Call)}
        assert not names & banned_calls, (rel, names & banned_calls)
