"""Inline HTTP tools (docs/api.md) and the http_get built-in, against a real local server."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from pydantic import ValidationError

from shared.agent.spec import HttpToolSpec, InlineTool
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from shared.errors import CallCancelled, SpecError, ToolError
from shared.llm.abort import Abort
from shared.store import calls as call_store
from shared.tools import HttpTool, InvalidToolArguments, ToolContext, fill_url, get
from tests.engine.helpers import agent, call, model_rounds, run, submit, transcript

from .conftest import LocalServer

TOKEN = "Bearer s3cret-value"


def make_tool(
    server: LocalServer, method: str, path: str, *, read_only: bool | None = None, **http: Any
) -> HttpTool:
    spec: dict[str, Any] = {
        "name": "remote",
        "description": "A remote tool.",
        "parameters": {
            "type": "object",
            "properties": {"id": {"type": "string"}},
            "required": ["id"],
        },
        "http": {"method": method, "url": server.url(path), **http},
    }
    if read_only is not None:
        spec["read_only"] = read_only
    return HttpTool(InlineTool.model_validate(spec))


def context(server: LocalServer, **kw: Any) -> ToolContext:
    kw.setdefault("env", {})
    return ToolContext(run_id="run-7", call_id="call_3", allow_hosts=(server.host_port,), **kw)


def echoed(text: str) -> Any:
    return json.loads(text)


def test_post_fills_the_url_and_sends_the_rest_as_json(server: LocalServer) -> None:
    remote = make_tool(server, "POST", "/items/{id}/notes")
    result = remote.execute({"id": "a b/c?", "text": "hello", "n": 2}, context(server))
    echo = echoed(result.text)
    assert echo["method"] == "POST"
    assert server.requests[0].path == "/items/a%20b%2Fc%3F/notes"
    assert echoed(echo["body"]) == {"text": "hello", "n": 2}
    assert echo["headers"]["content-type"] == "application/json"
    assert echo["headers"]["idempotency-key"] == "run-7:call_3"
    assert result.data == {"status": 200}
    assert remote.read_only is False  # N-5: not declared, so a write


def test_get_sends_the_rest_as_query_parameters(server: LocalServer) -> None:
    remote = make_tool(server, "GET", "/items/{id}", read_only=True)
    args = {"id": "7", "tags": ["a", "b"], "deep": {"k": 1}, "flag": True, "none": None}
    echo = echoed(remote.execute(args, context(server)).text)
    assert echo["path"] == "/items/7"
    assert echo["query"] == {"tags": ["a", "b"], "deep": ['{"k": 1}'], "flag": ["true"]}
    assert echo["body"] == ""


def test_idempotency_key_only_where_a_write_may_happen(server: LocalServer) -> None:
    ctx = context(server)
    read = make_tool(server, "GET", "/r/{id}", read_only=True)
    assert "idempotency-key" not in echoed(read.execute({"id": "1"}, ctx).text)["headers"]
    undeclared = make_tool(server, "GET", "/r/{id}")
    assert echoed(undeclared.execute({"id": "1"}, ctx).text)["headers"]["idempotency-key"]
    for method in ("PUT", "PATCH", "DELETE"):
        tool = make_tool(server, method, "/w/{id}", read_only=True)
        echo = echoed(tool.execute({"id": "1"}, ctx).text)
        assert (echo["method"], echo["headers"]["idempotency-key"]) == (method, "run-7:call_3")


def test_headers_come_from_env_at_call_time(
    server: LocalServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    remote = make_tool(server, "GET", "/h/{id}", headers_env={"Authorization": "TREADLE_T_TOK"})
    ctx = ToolContext(run_id="r", call_id="c", allow_hosts=(server.host_port,))  # os.environ
    monkeypatch.setenv("TREADLE_T_TOK", TOKEN)
    assert echoed(remote.execute({"id": "1"}, ctx).text)["headers"]["authorization"] == TOKEN
    monkeypatch.setenv("TREADLE_T_TOK", "Bearer rotated")
    assert echoed(remote.execute({"id": "1"}, ctx).text)["headers"]["authorization"] == (
        "Bearer rotated"
    )


def test_missing_env_names_the_variable_never_a_value(server: LocalServer) -> None:
    remote = make_tool(
        server, "POST", "/h", headers_env={"Authorization": "TICKETS_TOKEN", "X-Other": "OTHER"}
    )
    ctx = context(server, env={"OTHER": TOKEN})
    with pytest.raises(ToolError) as info:
        remote.execute({"id": "1"}, ctx)
    assert "TICKETS_TOKEN" in str(info.value) and "s3cret" not in str(info.value)
    assert server.requests == []


@pytest.mark.parametrize("status", [400, 404, 500])
def test_error_statuses_become_tool_errors(server: LocalServer, status: int) -> None:
    remote = make_tool(server, "GET", f"/status/{status}")
    with pytest.raises(
        ToolError, match=rf"^HTTP {status}: error {status}: the detail second line$"
    ):
        remote.execute({"id": "1"}, context(server))


def test_arguments_are_checked(server: LocalServer) -> None:
    remote = make_tool(server, "POST", "/x/{slot}")
    with pytest.raises(InvalidToolArguments, match="missing required id"):
        remote.execute({"slot": "1"}, context(server))
    with pytest.raises(InvalidToolArguments, match="missing URL argument"):
        remote.execute({"id": "1"}, context(server))
    with pytest.raises(InvalidToolArguments, match="expected an object"):
        remote.execute(["1"], context(server))  # type: ignore[arg-type]
    assert server.requests == []


def test_not_allow_listed_means_blocked(server: LocalServer) -> None:
    remote = make_tool(server, "GET", "/x/{id}")
    with pytest.raises(ToolError, match="blocked URL"):
        remote.execute({"id": "1"}, ToolContext(run_id="r", call_id="c", env={}))
    assert server.requests == []


def test_deadline_is_respected(server: LocalServer) -> None:
    remote = make_tool(server, "GET", "/x/{id}")
    with pytest.raises(ToolError, match="deadline exceeded"):
        remote.execute({"id": "1"}, context(server, deadline=time.time() - 1))
    slow = make_tool(server, "GET", "/slow?id={id}", timeout_s=0.5)
    with pytest.raises(ToolError, match="timed out"):
        slow.execute({"id": "1"}, context(server))


def test_response_text_is_capped(server: LocalServer) -> None:
    spec = InlineTool.model_validate(
        {"name": "big", "http": {"method": "GET", "url": server.url("/big?n={n}")}}
    )
    ctx = context(server)
    assert len(HttpTool(spec, max_bytes=100).execute({"n": 100}, ctx).text) == 100
    with pytest.raises(ToolError, match="response too large"):
        HttpTool(spec, max_bytes=100).execute({"n": 101}, ctx)


def test_fill_url() -> None:
    assert fill_url("https://x.test/{a}/{b}", {"a": "1/2", "b": 3, "c": True}) == (
        "https://x.test/1%2F2/3",
        {"c": True},
    )
    with pytest.raises(ValidationError, match="http.url"):  # the spec's schema says so
        InlineTool.model_validate({"name": "t", "http": {"url": "/relative/{x}"}})
    with pytest.raises(SpecError, match="absolute http"):  # and the tool, for code that skips it
        HttpTool(
            InlineTool.model_construct(
                name="t",
                http=HttpToolSpec.model_construct(
                    method="GET", url="/relative/{x}", headers_env={}, timeout_s=5.0
                ),
            )
        )


def test_http_get_fetches_text(server: LocalServer) -> None:
    http_get = get("http_get")
    assert http_get.read_only and not http_get.internal
    result = http_get.execute({"url": server.url("/echo?q=1")}, context(server))
    assert echoed(result.text)["query"] == {"q": ["1"]}
    assert "idempotency-key" not in echoed(result.text)["headers"]
    assert result.data == {
        "status": 200,
        "url": server.url("/echo?q=1"),
        "type": "application/json",
    }


def test_http_get_limits(server: LocalServer) -> None:
    http_get = get("http_get")
    with pytest.raises(ToolError, match="blocked URL"):
        http_get.execute({"url": server.url("/echo")}, ToolContext(run_id="r", call_id="c"))
    with pytest.raises(ToolError, match="^HTTP 404"):
        http_get.execute({"url": server.url("/status/404")}, context(server))
    with pytest.raises(ToolError, match="response too large"):
        http_get.execute({"url": server.url("/big?n=1000001")}, context(server))
    binary = http_get.execute({"url": server.url("/binary")}, context(server))
    assert binary.text == "(binary content: image/png, 108 bytes; not shown)"
    with pytest.raises(InvalidToolArguments, match="url: Field required"):
        http_get.execute({}, context(server))


@pytest.mark.parametrize(
    ("value", "stop"), [("true", True), ("TRUE", True), ("1", True), ("false", False), ("", False)]
)
def test_treadle_stop_header_ends_the_run(server: LocalServer, value: str, stop: bool) -> None:
    # SPEC L-6: a stop signal from an HTTP tool, as a plugin tool's ToolResult(stop=True)
    remote = make_tool(server, "GET", f"/stop?value={value}", read_only=True)
    result = remote.execute({"id": "1"}, context(server))
    assert (result.text, result.stop) == ("done here", stop)


def test_no_stop_without_the_header(server: LocalServer) -> None:
    remote = make_tool(server, "GET", "/items/{id}", read_only=True)
    assert remote.execute({"id": "1"}, context(server)).stop is False


@pytest.mark.parametrize("path", ["/slow?id={id}&delay=0.5", "/slow?id={id}&delay=20"])
def test_an_abort_ends_the_request_at_once(server: LocalServer, path: str) -> None:
    """The engine cancels a timed-out or cancelled call: the socket is shut, not abandoned
    (a trickle, and a server silent before its first byte of body)."""
    remote = make_tool(server, "GET", path, timeout_s=60, read_only=True)
    abort = Abort()
    threading.Timer(0.6, abort.cancel).start()
    started = time.monotonic()
    with pytest.raises(CallCancelled):
        remote.execute({"id": "1"}, context(server, abort=abort))
    assert time.monotonic() - started < 0.6 + 0.6


def test_an_http_tool_answering_treadle_stop_ends_the_run(
    sqlite_rt: Runtime, stub: StubBroker, server: LocalServer
) -> None:
    # SPEC L-6 over HTTP: Treadle-Stop: true on a 2xx ends the loop after this round's calls
    settings = sqlite_rt.settings.model_copy(update={"allow_hosts": "127.0.0.1"})
    rt = Runtime(engine=sqlite_rt.engine, settings=settings, publish=sqlite_rt.publish)
    finish = {
        "name": "finish_up",
        "description": "Hand the work over; the run ends.",
        "read_only": True,
        "parameters": {"type": "object", "properties": {}},
        "http": {"method": "GET", "url": server.url("/stop?value=true")},
    }
    spec = agent(
        [{"tool_calls": [call("finish_up", {}, "f1")]}, {"text": "never asked"}],
        tools=[finish],
    )
    run_id = submit(rt, spec)
    stub.drain(rt)
    r = run(rt, run_id)
    assert (r["status"], r["stop_reason"]) == ("completed", "stop_tool")
    assert model_rounds(rt, run_id) == 1  # exactly one model call
    tools = [x[1] for x in transcript(rt, run_id) if x[0] == "tool"]
    assert tools == ["done here"]


@pytest.mark.parametrize("parallel", [1, 3])
def test_a_stop_from_an_external_tool_skips_the_replys_later_calls(
    sqlite_rt: Runtime, stub: StubBroker, server: LocalServer, parallel: int
) -> None:
    # SPEC L-6: the later calls of the reply do not run (serial: never dispatched; parallel:
    # queued, their tool tasks find them done); each is recorded as skipped
    settings = sqlite_rt.settings.model_copy(update={"allow_hosts": "127.0.0.1"})
    rt = Runtime(engine=sqlite_rt.engine, settings=settings, publish=sqlite_rt.publish)
    finish = {
        "name": "finish_up",
        "description": "Hand the work over; the run ends.",
        "read_only": True,
        "parameters": {"type": "object", "properties": {}},
        "http": {"method": "GET", "url": server.url("/stop?value=true")},
    }
    reply = {
        "tool_calls": [
            call("finish_up", {}, "f1"),
            call("echo", {"text": "later one"}, "e1"),
            call("echo", {"text": "later two"}, "e2"),
        ]
    }
    spec = agent([reply, {"text": "never asked"}], tools=[finish, "echo"], parallel_tools=parallel)
    run_id = submit(rt, spec)
    stub.drain(rt)
    r = run(rt, run_id)
    assert (r["status"], r["stop_reason"]) == ("completed", "stop_tool")
    assert model_rounds(rt, run_id) == 1
    skipped = "Skipped: not run because the run stopped."
    tools = [x[1] for x in transcript(rt, run_id) if x[0] == "tool"]
    assert tools == ["done here", skipped, skipped]
    with rt.engine.connect() as conn:
        calls = {c.call_id: c for c in call_store.list_tool_calls(conn, run_id)}
    assert {i: (calls[i].status, calls[i].data) for i in ("e1", "e2")} == {
        "e1": ("done", {"skipped": "stop"}),
        "e2": ("done", {"skipped": "stop"}),
    }
    assert (calls["e1"].attempts, calls["e2"].attempts) == (0, 0)  # never claimed


def test_an_event_stream_reports_progress_as_it_arrives(server: LocalServer) -> None:
    seen: list[tuple[Any, Any, Any, float]] = []
    ctx = context(server, on_progress=lambda p, t, m: seen.append((p, t, m, time.monotonic())))
    remote = make_tool(server, "GET", "/events", read_only=True)
    started = time.monotonic()
    result = remote.execute({"id": "x", "n": 5}, ctx)
    ended = time.monotonic()
    assert result.text == "all\ndone"
    assert [(p, t, m) for p, t, m, _ in seen] == [(i, 5, f"step {i}") for i in range(1, 6)]
    assert seen[0][3] - started < (ended - started) / 2  # streamed: not all at the end
