"""MCP tools against a real MCP server (the ``mcp`` package's own, on 127.0.0.1): listing,
schemas and hints, names, calls with the idempotency key, the SSRF guard, failures as tool
errors, bounds, SSE and stdio."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from shared.agent.spec import McpServerSpec
from shared.errors import ToolError
from shared.tools import ToolContext
from shared.tools.mcp_tools import McpAccess, McpListing, McpServer, ToolLists, list_mcp_tools
from tests.mcp_hostile import HostileMcp
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
    assert set(tools) == {"lookup", "book", "tally", "fail", "big", "slow", "steps"}
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


def test_progress_notifications_reach_the_context_in_order(mcp: McpTestServer) -> None:
    seen: list[tuple[float | None, float | None, str | None]] = []
    ctx = _ctx(on_progress=lambda p, t, m: seen.append((p, t, m)))
    result = _tools(mcp)["steps"].execute({"count": 5}, ctx)
    assert result.text == "did 5 steps"
    assert seen == [(float(i), 5.0, f"step {i} of 5") for i in range(1, 6)]


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
    lookup.execute({"city": "warm"}, _ctx())  # the first call may start the loop's thread
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


# --- a hostile server: bounded lists, results, waits and memory -------------------


def _hostile(server: HostileMcp, lists: ToolLists | None = None, **kw: Any) -> McpListing:
    access = McpAccess(allow_hosts=(server.host,), **kw)
    return list_mcp_tools([_spec(server.url)], access, lists)


def test_a_huge_list_is_cut_at_the_tool_limit() -> None:
    with HostileMcp(tools=1000) as server:
        listing = _hostile(server, max_tools=64)
        assert len(listing.tools) == 64
        assert any("lists more than 64 tools" in w for w in listing.warnings)
        access = McpAccess(allow_hosts=(server.host,), max_tools=64)
        roomy = list_mcp_tools([_spec(server.url)], access, room=10)
        assert len(roomy.tools) == 10  # the run's limit: its spec's own tools came first
        assert any("TREADLE_MAX_TOOLS" in w for w in roomy.warnings)


def test_a_list_is_bounded_in_bytes_and_schemas_in_depth() -> None:
    with HostileMcp(tools=50, description_bytes=1_500) as server:
        listing = _hostile(server, list_bytes=20_000)
        assert 5 <= len(listing.tools) < 20
        assert any("TREADLE_MCP_LIST_MAX_BYTES" in w for w in listing.warnings)
    with HostileMcp(tools=3, depth=40) as server:
        listing = _hostile(server)
        assert listing.tools == []
        assert any("schema too deep" in w for w in listing.warnings)


def test_a_huge_or_deep_result_is_refused_or_trimmed() -> None:
    with HostileMcp(tools=1, result_bytes=10_000_000) as server:
        [tool] = _hostile(server).tools
        started = time.monotonic()
        with pytest.raises(ToolError, match="too large"):
            tool.execute({}, _ctx())
        assert time.monotonic() - started < 10
    with HostileMcp(tools=1, structured_depth=60) as server:
        [tool] = _hostile(server).tools
        result = tool.execute({}, _ctx())
        assert result.data is not None and "structured" not in result.data
        assert "deeper than" in result.data["structured_dropped"]
        server.how.structured_depth = 300  # past what the SDK's parser reads: refused
        with pytest.raises(ToolError, match="recursion limit"):
            tool.execute({}, _ctx())


def test_a_slow_listing_is_waited_for_a_bounded_while_and_only_once() -> None:
    lists = ToolLists()
    with HostileMcp(tools=3, list_delay=60) as server:
        started = time.monotonic()
        first = _hostile(server, lists, wait_s=0.5)
        second = _hostile(server, lists, wait_s=0.5)
        assert time.monotonic() - started < 5
        for listing in (first, second):
            assert listing.tools == []
            assert "did not list its tools within 0.5s" in listing.unreachable["bookings"]
        assert server.requests("tools/list") == 1  # one listing in flight, not one a round


def test_the_deadline_and_the_operator_cap_bound_waits_and_calls() -> None:
    with HostileMcp(tools=1, list_delay=60) as server:
        started = time.monotonic()
        listing = _hostile(server, deadline=time.time() + 0.3)
        assert listing.unreachable and time.monotonic() - started < 3
    with HostileMcp(tools=1, call_delay=60) as server:
        spec = _spec(server.url, timeout_s=300)  # the spec asks 5 minutes
        access = McpAccess(allow_hosts=(server.host,), timeout_s=1.0)  # the operator: 1 s
        [tool] = list_mcp_tools([spec], access).tools
        started = time.monotonic()
        with pytest.raises(ToolError, match="timed out after 1s"):
            tool.execute({}, _ctx())
        assert time.monotonic() - started < 8


def test_a_tenant_has_a_bounded_number_of_waiting_threads() -> None:
    lists = ToolLists(tenant_waiters=1)
    with HostileMcp(tools=1, list_delay=60) as server:
        waiting = threading.Thread(target=_hostile, args=(server, lists), kwargs={"wait_s": 3})
        waiting.start()
        time.sleep(0.3)
        started = time.monotonic()
        access = McpAccess(allow_hosts=(server.host,), wait_s=3, tenant="default")
        busy = list_mcp_tools([_spec(server.url)], access, lists)
        assert busy.unreachable and time.monotonic() - started < 1  # no second waiter
        assert busy.deferred  # the round comes back for it, holding no thread meanwhile
        other = McpAccess(allow_hosts=(server.host,), wait_s=0.5, tenant="acme")
        started = time.monotonic()
        list_mcp_tools([_spec(server.url)], other, lists)
        assert 0.4 < time.monotonic() - started < 2  # another tenant's thread may wait
        waiting.join()


def test_the_tool_list_cache_is_bounded_in_bytes_across_servers() -> None:
    lists = ToolLists(limit_bytes=200_000)
    with HostileMcp(tools=20, description_bytes=1_000) as server:
        access = McpAccess(allow_hosts=(server.host,))
        for i in range(40):
            spec = _spec(f"{server.url}?n={i}")
            assert len(list_mcp_tools([spec], access, lists).tools) == 20
        assert lists.bytes <= 200_000
        assert 1 <= len(lists) < 40  # the oldest lists were evicted
