"""MCP tools against a real MCP server (the ``mcp`` package's own, on 127.0.0.1): listing,
schemas and hints, names, calls with the idempotency key, the SSRF guard, failures as tool
errors, bounds, SSE and stdio."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from shared.agent.spec import McpServerSpec
from shared.errors import ToolError
from shared.tools import ToolContext
from shared.tools.mcp_tools import McpAccess, McpServer, ToolLists, list_mcp_tools
from tests.mcp_server import McpTestServer


@pytest.fixture(scope="module")
def mcp() -> Iterator[McpTestServer]:
    with McpTestServer() as server:
        yield server


def _spec(url: str, **kw: Any) -> McpServerSpec:
    return McpServerSpec.model_validate({"name": "bookings", "url": url, **kw})


def _access(server: McpTestServer, **kw: Any) -> McpAccess:
    return McpAccess(allow_hosts=(server.host,), **kw)


def _ctx(**kw: Any) -> ToolContext:
    return ToolContext(run_id="run_1", call_id="call_1", **kw)


def _tools(server: McpTestServer, **kw: Any) -> dict[str, Any]:
    listing = list_mcp_tools([_spec(server.url, **kw)], _access(server))
    assert not listing.unreachable, listing.unreachable
    return {t.name: t for t in listing.tools}


def test_tools_listed_with_schemas_and_hints(mcp: McpTestServer) -> None:
    tools = _tools(mcp, read_only=["tally"])
    assert set(tools) == {"lookup", "book", "tally", "fail", "big", "slow"}
    assert tools["lookup"].description == "Look up the weather of a city."
    assert tools["lookup"].parameters["required"] == ["city"]
    assert tools["lookup"].read_only  # readOnlyHint
    assert tools["tally"].read_only  # the spec's read_only
    assert not tools["book"].read_only  # any other tool is a write


def test_allow_filters_and_names_missing(mcp: McpTestServer) -> None:
    listing = list_mcp_tools([_spec(mcp.url, allow=["lookup", "nope"])], _access(mcp), environ={})
    assert [t.name for t in listing.tools] == ["lookup"]
    assert listing.warnings == ["MCP server 'bookings' has no tool(s) nope"]


def test_colliding_names_are_namespaced(mcp: McpTestServer) -> None:
    specs = [
        McpServerSpec(name="one", url=mcp.url, allow=["lookup", "book"]),
        McpServerSpec(name="two", url=mcp.url, allow=["lookup"]),
    ]
    listing = list_mcp_tools(specs, _access(mcp), taken=["book"])
    names = [(t.name, t.remote, t.server.name) for t in listing.tools]
    assert names == [
        ("one__lookup", "lookup", "one"),
        ("one__book", "book", "one"),
        ("two__lookup", "lookup", "two"),
    ]


def test_call_passes_idempotency_key_in_meta(mcp: McpTestServer) -> None:
    book = _tools(mcp)["book"]
    result = book.execute({"room": "Ada"}, _ctx())
    assert result.text == "booked Ada"
    assert result.data == {"mcp_server": "bookings", "structured": {"result": "booked Ada"}}
    assert mcp.effects.hits["run_1:call_1"] >= 1


def test_tool_error_is_a_tool_error(mcp: McpTestServer) -> None:
    with pytest.raises(ToolError, match="the booking system is closed"):
        _tools(mcp)["fail"].execute({}, _ctx())


def test_private_address_refused_unless_allowed(mcp: McpTestServer) -> None:
    spec = _spec(mcp.url)
    listing = list_mcp_tools([spec], McpAccess())
    assert listing.tools == []
    assert (
        "blocked URL: 127.0.0.1 (loopback address; not allow-listed)"
        in (listing.unreachable["bookings"])
    )
    with pytest.raises(ToolError, match="MCP server .bookings.: blocked URL"):
        McpServer(spec, McpAccess()).call("lookup", {"city": "x"}, _ctx(), 5)
    assert list_mcp_tools([spec], _access(mcp)).tools  # allow-listed: reached


def test_unreachable_server_is_a_clear_tool_error() -> None:
    with McpTestServer() as server:
        lookup = _tools(server)["lookup"]
    with pytest.raises(ToolError, match=r"MCP server 'bookings': unreachable"):
        lookup.execute({"city": "Oslo"}, _ctx())


def test_timeout_bounds_the_call(mcp: McpTestServer) -> None:
    slow = _tools(mcp, timeout_s=0.5)["slow"]
    with pytest.raises(ToolError, match=r"timed out after 0.5s"):
        slow.execute({"seconds": 5}, _ctx())


def test_response_size_is_bounded(mcp: McpTestServer) -> None:
    listing = list_mcp_tools([_spec(mcp.url)], _access(mcp, max_bytes=20_000))
    big = {t.name: t for t in listing.tools}["big"]
    assert len(big.execute({"size": 1000}, _ctx()).text) == 1000
    with pytest.raises(ToolError, match="too large"):
        big.execute({"size": 50_000}, _ctx())


def test_tool_list_cached_and_stale_list_serves(mcp: McpTestServer) -> None:
    lists = ToolLists()
    with McpTestServer() as server:
        spec = _spec(server.url)
        first = list_mcp_tools([spec], McpAccess(allow_hosts=(server.host,), ttl=0.01), lists)
    second = list_mcp_tools([spec], McpAccess(allow_hosts=(server.host,), ttl=0.01), lists)
    assert [t.name for t in second.tools] == [t.name for t in first.tools]  # stale, down
    assert not second.unreachable


def test_sse_transport() -> None:
    with McpTestServer(transport="sse") as server:
        tools = _tools(server)
        assert tools["lookup"].execute({"city": "Rome"}, _ctx()).text == "Rome: 21C, sunny"


def test_stdio_for_operator_specs() -> None:
    spec = McpServerSpec(name="local", command=[sys.executable, "-m", "tests.mcp_server"])
    listing = list_mcp_tools([spec], McpAccess())
    tools = {t.name: t for t in listing.tools}
    assert tools["lookup"].execute({"city": "Bern"}, _ctx()).text == "Bern: 21C, sunny"


def test_calls_share_one_loop_thread(mcp: McpTestServer) -> None:
    lookup = _tools(mcp)["lookup"]
    before = threading.active_count()
    for i in range(5):
        assert lookup.execute({"city": f"c{i}"}, _ctx()).text.startswith(f"c{i}")
    assert threading.active_count() <= before
    assert sum(t.name == "treadle-aio" for t in threading.enumerate()) == 1


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"name": "x"}, "exactly one of `url` or `command`"),
        ({"name": "x", "url": "ftp://h/x"}, "string_pattern_mismatch"),
        ({"name": "x", "url": "http://h/x", "env": {"A": "B"}}, "`env` is for stdio"),
        ({"name": "bad name", "url": "http://h/x"}, "string_pattern_mismatch"),
    ],
)
def test_spec_validation(body: dict[str, Any], message: str) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as err:
        McpServerSpec.model_validate(body)
    assert message in str(err.value) or message in str(err.value.errors())


def test_transport_by_url() -> None:
    assert McpServerSpec(name="a", url="https://h.example/sse").kind == "sse"
    assert McpServerSpec(name="a", url="https://h.example/mcp").kind == "streamable_http"
    forced = McpServerSpec(name="a", url="https://h.example/sse", transport="streamable_http")
    assert forced.kind == "streamable_http"
