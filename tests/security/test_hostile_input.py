"""Hostile input changes nothing: malformed JSON, wrong types, huge strings, unknown
fields, invalid UTF-8, bad ids, NUL characters — each gets a clear 4xx in the error shape, and
every table keeps its rows (counted, and compared whole). On SQLite and on PostgreSQL (which
refuses NUL in text columns and enforces column lengths)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from shared.config import Settings
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from tests.engine.helpers import agent, call
from tests.security.conftest import DATA_TABLES, MakeKey, bearer, row_counts

HUGE = "x" * 2_100_000


@pytest.fixture(params=["sqlite", "postgresql"])
def secure_rt(request: pytest.FixtureRequest, stub: StubBroker) -> Runtime:
    """Overrides the conftest's: keys required, on each database."""
    if request.param == "sqlite":
        base: Runtime = request.getfixturevalue("sqlite_rt")
        engine, url = base.engine, base.settings.database_url
    else:
        engine, url = request.getfixturevalue("pg_engine"), request.getfixturevalue("pg_url")
    settings = Settings(database_url=url, broker_url="memory://", auth="required")
    return Runtime(engine=engine, settings=settings, publish=stub)


def _snapshot(rt: Runtime) -> tuple[dict[str, int], str]:
    digest = hashlib.sha256()
    with rt.engine.connect() as conn:
        for table in DATA_TABLES:
            for row in conn.execute(sa.select(table).order_by(*table.primary_key.columns)):
                digest.update(json.dumps(list(row), default=str).encode())
    return row_counts(rt), digest.hexdigest()


@pytest.fixture
def key(api: TestClient, secure_rt: Runtime, stub: StubBroker, make_key: MakeKey) -> str:
    """A tenant with a run waiting on an ask, a thread and a file."""
    k = make_key("acme")
    ask = {"question": "Which city?", "options": ["Paris", "Rome"]}
    spec = agent(
        [{"tool_calls": [call("ask_user", ask, "ask1")]}, {"text": "ok"}], ask=True
    ).model_dump(mode="json", exclude_none=True)
    made = api.post("/v1/runs", json={"agent": spec, "input": "go"}, headers=bearer(k))
    stub.drain(secure_rt)
    run = api.get(f"/v1/runs/{made.json()['id']}", headers=bearer(k)).json()
    assert run["status"] == "waiting"
    api.post("/v1/threads", json={}, headers=bearer(k))
    api.post("/v1/files", files={"file": ("a.txt", b"hello")}, headers=bearer(k))
    return k


def _run_id(api: TestClient, key: str) -> str:
    return str(api.get("/v1/runs", headers=bearer(key)).json()["runs"][0]["id"])


JSON = {"content-type": "application/json"}
BODIES: list[tuple[str, bytes | str | dict[str, Any]]] = [
    ("malformed json", b'{"agent": "demo", "input": '),
    ("not an object", b"[1, 2, 3]"),
    ("invalid utf-8", b'{"agent": "demo", "input": "\xff\xfe\xfa"}'),
    ("utf-16 garbage", b"\xff\xfe{\x00\xd8"),
    ("nul bytes", b'{"agent": "demo", "input": "hi"}\x00\x00'),
    ("wrong types", {"agent": 42, "input": {"a": 1}, "attachments": "file_x"}),
    ("unknown field", {"agent": "demo", "input": "hi", "admin": True}),
    (
        "unknown spec field",
        {"agent": {"kind": "chat", "model": "demo", "shell": "rm -rf /"}, "input": "hi"},
    ),
    ("bad thread id", {"agent": "demo", "input": "hi", "thread_id": "../../etc/passwd"}),
    ("long thread id", {"agent": "demo", "input": "hi", "thread_id": "t" * 41}),
    ("nul in thread id", {"agent": "demo", "input": "hi", "thread_id": "thr_\u0000"}),
    (
        "nul in webhook url",
        {
            "agent": "demo",
            "input": "hi",
            "webhook": {"url": "https://93.184.216.34/\u0000", "events": ["*"]},
        },
    ),
    (
        "bad secret_env",
        {
            "agent": "demo",
            "input": "hi",
            "webhook": {"url": "https://93.184.216.34/", "secret_env": "X" * 200},
        },
    ),
    ("huge string", {"agent": "demo", "input": HUGE}),
    ("huge metadata", {"agent": "demo", "input": "hi", "metadata": {"k": HUGE}}),
    (
        "deep nesting",
        b'{"agent": "demo", "input": "hi", "metadata": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    ),
    ("empty input", {"agent": "demo", "input": ""}),
    ("unknown agent", {"agent": "no-such-agent", "input": "hi"}),
    ("unknown tool", {"agent": {"kind": "agent", "model": "demo", "tools": ["rm"]}, "input": "hi"}),
]


def _send(api: TestClient, method: str, path: str, body: Any, key: str) -> Any:
    headers = {**bearer(key), **JSON}
    if isinstance(body, dict):
        return api.request(method, path, content=json.dumps(body), headers=headers)
    return api.request(method, path, content=body, headers=headers)


def _assert_clear_4xx(got: Any, what: str) -> None:
    assert 400 <= got.status_code < 500, (what, got.status_code, got.text[:300])
    err = got.json()["error"]
    assert err["code"] and err["message"], what


@pytest.mark.parametrize(("what", "body"), BODIES, ids=[b[0] for b in BODIES])
def test_hostile_submissions_change_nothing(
    api: TestClient, secure_rt: Runtime, key: str, what: str, body: Any
) -> None:
    before = _snapshot(secure_rt)
    _assert_clear_4xx(_send(api, "POST", "/v1/runs", body, key), what)
    assert _snapshot(secure_rt) == before


@pytest.mark.parametrize(
    ("what", "body"),
    BODIES[:7]
    + [
        ("wrong answer types", {"ask_id": 1, "answers": "Paris"}),
        ("too many answers", {"ask_id": "ask1", "answers": ["a", "b", "c", "d"]}),
        ("unknown field", {"ask_id": "ask1", "answers": ["Paris"], "force": True}),
        ("huge answer", {"ask_id": "ask1", "answers": [HUGE]}),
        ("wrong ask", {"ask_id": "ask9", "answers": ["Paris"]}),
    ],
    ids=[b[0] for b in BODIES[:7]] + ["types", "count", "unknown", "huge", "wrong ask"],
)
def test_hostile_answers_change_nothing(
    api: TestClient, secure_rt: Runtime, key: str, what: str, body: Any
) -> None:
    path = f"/v1/runs/{_run_id(api, key)}/answer"
    before = _snapshot(secure_rt)
    _assert_clear_4xx(_send(api, "POST", path, body, key), what)
    assert _snapshot(secure_rt) == before


def test_hostile_requests_elsewhere_change_nothing(
    api: TestClient, secure_rt: Runtime, key: str
) -> None:
    run_id = _run_id(api, key)
    before = _snapshot(secure_rt)
    cases: list[tuple[str, str, Any]] = [
        ("POST", f"/v1/runs/{run_id}/approval", {"approval_id": "x", "approve": 7}),
        ("POST", f"/v1/runs/{run_id}/approval", {"approval_id": "ask1", "approve": "all"}),
        ("POST", f"/v1/runs/{run_id}/approval", {"approval_id": "a", "approve": [], "x": 1}),
        ("POST", "/v1/threads", {"multitask": "explode"}),
        ("POST", "/v1/threads", {"metadata": "not a dict"}),
        ("POST", "/v1/threads", b"\xff\xfe"),
        ("GET", "/v1/runs/%00%01", None),
        ("GET", "/v1/runs/" + "r" * 300, None),
        ("GET", "/v1/runs?limit=0", None),
        ("GET", "/v1/runs?limit=abc", None),
        ("GET", "/v1/runs?cursor=garbage", None),
        ("GET", f"/v1/runs/{run_id}/events?after=-5", None),
        ("GET", "/v1/threads/..%2F..%2Fetc", None),
        ("GET", "/v1/files/%27%20OR%201%3D1--", None),
        ("POST", "/v1/files", b"not multipart"),
        ("DELETE", f"/v1/runs/{run_id}", None),
    ]
    for method, path, body in cases:
        got = _send(api, method, path, body, key)
        _assert_clear_4xx(got, f"{method} {path} {body!r}"[:200])
    empty = api.post("/v1/files", files={"file": ("e.txt", b"")}, headers=bearer(key))
    _assert_clear_4xx(empty, "empty file")
    assert _snapshot(secure_rt) == before
    assert api.get(f"/v1/runs/{run_id}", headers=bearer(key)).json()["status"] == "waiting"


def _nested(depth: int, leaf: str = "1") -> str:
    return '{"a":' * depth + leaf + "}" * depth


EDGE: list[tuple[str, str, str]] = [
    ("deep metadata", "/v1/runs", '{"agent":"demo","input":"x","metadata":' + _nested(900) + "}"),
    ("deep spec", "/v1/runs", '{"agent":"demo","input":"x","inputs":' + _nested(100) + "}"),
    ("metadata 9 deep", "/v1/runs", '{"agent":"demo","input":"x","metadata":' + _nested(9) + "}"),
    (
        "big metadata",
        "/v1/runs",
        json.dumps({"agent": "demo", "input": "x", "metadata": {"k": "v" * 20_000}}),
    ),  # fmt: skip
    ("NaN", "/v1/runs", '{"agent":"demo","input":"x","metadata":{"a":NaN}}'),
    ("1e999", "/v1/runs", '{"agent":{"kind":"chat","budget":{"max_cost":1e999}},"input":"x"}'),
    ("-Infinity", "/v1/runs", '{"agent":"demo","input":"x","metadata":{"a":-Infinity}}'),
    ("NUL", "/v1/runs", '{"agent":"demo","input":"x\\u0000y"}'),
    ("NUL key", "/v1/runs", '{"agent":"demo","input":"x","metadata":{"a\\u0000":1}}'),
    ("NUL dataset name", "/v1/datasets", '{"name":"a\\u0000b"}'),
    ("deep responses", "/openai/v1/responses", "[" * 100_000 + "]" * 100_000),
    ("unknown model", "/openai/v1/responses", '{"model":"nope","input":"hi"}'),
    ("too long", "/openai/v1/responses", '{"model":"demo","input":"' + "x" * 250_000 + '"}'),
    ("unknown assistant", "/langgraph/runs", '{"assistant_id":"nope","input":{}}'),
    ("bad messages", "/langgraph/runs", '{"assistant_id":"demo","input":{"messages":"x"}}'),
    ("lg limit abc", "/langgraph/threads/search", '{"limit":"abc"}'),
    ("lg limit -1", "/langgraph/threads/search", '{"limit":-1}'),
    ("lg deep", "/langgraph/threads", '{"metadata":' + _nested(50) + "}"),
]


@pytest.mark.parametrize(("what", "path", "body"), EDGE, ids=[e[0] for e in EDGE])
def test_hostile_json_is_refused_at_the_edge_and_writes_nothing(
    api: TestClient, secure_rt: Runtime, key: str, what: str, path: str, body: str
) -> None:
    before = _snapshot(secure_rt)
    _assert_clear_4xx(_send(api, "POST", path, body.encode(), key), what)
    assert _snapshot(secure_rt) == before


@pytest.mark.parametrize(
    "path",
    ["/v1/runs/%00/usage", "/langgraph/threads/%00", "/v1/runs?status=%00", "/v1/files/a%01"],
)
def test_control_characters_in_paths_are_refused(api: TestClient, key: str, path: str) -> None:
    got = api.get(path, headers=bearer(key))
    assert got.status_code == 422 and "control characters" in got.text


@pytest.mark.parametrize(
    "path",
    ["/v1/runs", "/openai/v1/responses", "/langgraph/runs", "/langgraph/threads/search"],
)
def test_the_key_is_checked_before_the_body_is_read(
    api: TestClient, secure_rt: Runtime, path: str
) -> None:
    before = _snapshot(secure_rt)
    for body in (b"{not json", b"[" * 5000, b'{"model": 7}'):
        got = api.post(path, content=body, headers=JSON)
        assert got.status_code == 401, (path, body[:20], got.text)
    assert _snapshot(secure_rt) == before


def test_limits_count_sub_agents_and_system_prompts(
    api: TestClient, secure_rt: Runtime, key: str
) -> None:
    tools = [{"name": f"t{i}", "http": {"url": "https://93.184.216.34/"}} for i in range(40)]
    sub = {"kind": "agent", "model": "demo", "tools": tools}
    spec = {"kind": "agent", "model": "demo", "tools": [*tools, {"name": "sub", "agent": sub}]}
    prompt = {"kind": "chat", "model": "demo", "system_prompt": "p" * 199_999}
    before = _snapshot(secure_rt)
    for agent_spec, words in ((spec, "TREADLE_MAX_TOOLS"), (prompt, "TREADLE_MAX_INPUT_CHARS")):
        got = api.post(
            "/v1/runs", json={"agent": agent_spec, "input": "hello"}, headers=bearer(key)
        )
        assert got.status_code == 413 and words in got.text, got.text
    assert _snapshot(secure_rt) == before


# --- the LangGraph facade's parameters ----------------------------------------------

LONG_ID = "a" * 65


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("post", "/langgraph/assistants/search", {"limit": "abc"}),
        ("post", "/langgraph/assistants/search", {"offset": "x"}),
        ("post", "/langgraph/assistants/search", {"limit": 1.5}),
        ("post", "/langgraph/assistants/search", {"limit": True}),
        ("post", "/langgraph/assistants/search", {"offset": -1}),
        ("post", "/langgraph/assistants/demo/versions", {"limit": "abc"}),
        ("post", "/langgraph/assistants/demo/versions", {"offset": [1]}),
        ("post", "/langgraph/assistants", {"assistant_id": LONG_ID, "graph_id": "demo"}),
        ("post", "/langgraph/assistants", {"assistant_id": "bad name", "graph_id": "demo"}),
        ("get", f"/langgraph/assistants/{LONG_ID}", None),
        ("get", f"/langgraph/assistants/{LONG_ID}@1", None),
        ("post", f"/langgraph/assistants/{LONG_ID}/versions", {}),
        ("patch", f"/langgraph/assistants/{LONG_ID}", {"graph_id": "demo"}),
        ("get", "/langgraph/assistants/demo@99999999999", None),
    ],
)
def test_langgraph_assistant_parameters_are_checked(
    api: TestClient, key: str, secure_rt: Runtime, method: str, path: str, body: Any
) -> None:
    before = _snapshot(secure_rt)
    kwargs = {"json": body} if body is not None else {}
    got = getattr(api, method)(path, headers=bearer(key), **kwargs)
    assert got.status_code in (404, 422), (got.status_code, got.text[:300])
    assert set(got.json()) == {"error"}
    assert _snapshot(secure_rt) == before


# --- env and header names a spec may give -------------------------------------------


def _http_tool(headers_env: dict[str, str]) -> dict[str, Any]:
    return {"name": "t", "http": {"url": "https://93.184.216.34/x", "headers_env": headers_env}}


ODD_NAMES: list[tuple[str, dict[str, Any]]] = [
    ("api_key_env with a dash", {"model": {"provider": "openai", "api_key_env": "MY-KEY"}}),
    ("api_key_env with $()", {"model": {"provider": "openai", "api_key_env": "$(id)"}}),
    ("api_key_env with a newline", {"model": {"provider": "openai", "api_key_env": "K\nX"}}),
    ("a header with a space", {"tools": [_http_tool({"Bad Header": "TOKEN"})]}),
    ("a header with CRLF", {"tools": [_http_tool({"X\r\nEvil": "TOKEN"})]}),
    ("Host", {"tools": [_http_tool({"Host": "TOKEN"})]}),
    ("Transfer-Encoding", {"tools": [_http_tool({"transfer-encoding": "TOKEN"})]}),
    ("an env name with a dot", {"tools": [_http_tool({"X-Token": "A.B"})]}),
    ("33 headers", {"tools": [_http_tool({f"X-H{i}": "TOKEN" for i in range(33)})]}),
    (
        "an MCP Content-Length",
        {
            "mcp": [
                {
                    "name": "m",
                    "url": "https://93.184.216.34/mcp",
                    "headers_env": {"Content-Length": "T"},
                }
            ]
        },
    ),
]


@pytest.mark.parametrize(("what", "spec"), ODD_NAMES, ids=[w for w, _ in ODD_NAMES])
def test_odd_env_and_header_names_are_refused(
    api: TestClient, secure_rt: Runtime, make_key: MakeKey, what: str, spec: dict[str, Any]
) -> None:
    key = make_key("acme")
    body = {"kind": "agent", "model": "demo", **spec}
    before = _snapshot(secure_rt)
    got = api.post("/v1/runs", json={"agent": body, "input": "hi"}, headers=bearer(key))
    assert got.status_code == 422, (what, got.text[:300])
    assert _snapshot(secure_rt) == before
