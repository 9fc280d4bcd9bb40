"""Kept-alive guarded connections (``GuardedPools``): reused only for the checked address and
TLS name they were made for, never a way around the check, the time cap or an abort."""

from __future__ import annotations

import json
import ssl
import threading
import time
from collections.abc import Iterator

import pytest

from shared.agent.spec import HttpToolSpec, InlineTool
from shared.errors import BlockedAddress, CallCancelled, ToolError
from shared.llm import abort as abort_mod
from shared.llm.abort import Abort
from shared.tools import HttpTool, ToolContext
from shared.tools.netguard import GuardedPools, safe_request

from .conftest import Certs, FakeDns, LocalServer


@pytest.fixture
def pools() -> Iterator[GuardedPools]:
    made = GuardedPools()
    yield made
    made.close()


def ports(server: LocalServer) -> list[int]:
    return [r.peer_port for r in server.requests]


def test_pooled_requests_reuse_a_connection(server: LocalServer, pools: GuardedPools) -> None:
    allow = [server.host_port]
    for _ in range(3):
        safe_request("GET", server.url("/a"), allow_hosts=allow, pools=pools)
    assert len(set(ports(server))) == 1
    assert server.requests[0].headers["connection"] == "keep-alive"


def test_without_pools_each_call_connects_afresh(server: LocalServer) -> None:
    for _ in range(3):
        safe_request("GET", server.url("/a"), allow_hosts=[server.host_port])
    assert len(set(ports(server))) == 3


def test_an_open_connection_does_not_bypass_the_check(
    server: LocalServer, pools: GuardedPools, fake_dns: FakeDns
) -> None:
    """One tenant's allow-listed host leaves a connection open: another tenant's request to
    the same name or address is still refused (the check runs before every request)."""
    fake_dns({"inside.test": ["127.0.0.1"]})
    url = f"http://inside.test:{server.port}/a"
    safe_request("GET", url, allow_hosts=[f"inside.test:{server.port}"], pools=pools)
    for other in (url, server.url("/a")):
        with pytest.raises(BlockedAddress, match="loopback"):
            safe_request("GET", other, pools=pools)
    assert len(server.requests) == 1


def test_a_connection_serves_only_the_address_it_was_checked_for(
    server: LocalServer, pools: GuardedPools, fake_dns: FakeDns
) -> None:
    """The name now resolves elsewhere (rebinding): the request goes to the new checked
    address (here nobody listens), not over the connection still open to the old one."""
    table = {"moving.test": ["127.0.0.1"]}
    fake_dns(table)
    url, allow = f"http://moving.test:{server.port}/a", [f"moving.test:{server.port}"]
    safe_request("GET", url, allow_hosts=allow, pools=pools)
    table["moving.test"] = ["127.0.0.2"]
    with pytest.raises(ToolError, match="failed"):
        safe_request("GET", url, allow_hosts=allow, pools=pools)
    assert len(server.requests) == 1


def test_a_tls_connection_never_serves_another_name(
    tls_server: LocalServer,
    certs: Certs,
    fake_dns: FakeDns,
    pools: GuardedPools,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both names resolve to the server, whose certificate is for tool.test only: a request
    to other.test gets its own connection, whose certificate check fails."""
    trusted = ssl.create_default_context(cafile=str(certs.ca))
    monkeypatch.setattr(abort_mod, "_tls_context", lambda: trusted)
    fake_dns({"tool.test": ["127.0.0.1"], "other.test": ["127.0.0.1"]})
    allow = ["tool.test", "other.test"]
    url = f"https://tool.test:{tls_server.port}/echo"
    first = safe_request("GET", url, allow_hosts=allow, pools=pools)
    assert json.loads(first.text)["headers"]["host"] == f"tool.test:{tls_server.port}"
    with pytest.raises(ToolError, match="CERTIFICATE_VERIFY_FAILED|certificate"):
        safe_request(
            "GET", f"https://other.test:{tls_server.port}/echo", allow_hosts=allow, pools=pools
        )
    again = safe_request("GET", url, allow_hosts=allow, pools=pools)
    assert again.status_code == 200
    assert len(set(ports(tls_server))) == 1  # tool.test's connection, kept alive


def test_the_total_time_cap_holds_on_a_pooled_connection(
    server: LocalServer, pools: GuardedPools
) -> None:
    allow = [server.host_port]
    safe_request("GET", server.url("/a"), allow_hosts=allow, pools=pools)  # warm
    started = time.monotonic()
    with pytest.raises(ToolError, match=r"timed out after 1s"):
        safe_request("GET", server.url("/slow?delay=0.9"), timeout=1.0, allow_hosts=allow,
                     pools=pools)  # fmt: skip
    assert time.monotonic() - started < 1.4
    after = safe_request("GET", server.url("/b"), allow_hosts=allow, pools=pools)
    assert after.status_code == 200  # the shut connection was not handed out again


def test_the_size_cap_holds_on_a_pooled_connection(
    server: LocalServer, pools: GuardedPools
) -> None:
    allow = [server.host_port]
    with pytest.raises(ToolError, match="response too large"):
        safe_request("GET", server.url("/stream?n=40960"), max_bytes=2000, allow_hosts=allow,
                     pools=pools)  # fmt: skip
    assert safe_request("GET", server.url("/b"), allow_hosts=allow, pools=pools).status_code == 200


def test_an_abort_ends_a_pooled_request_at_once(server: LocalServer, pools: GuardedPools) -> None:
    abort = Abort()
    threading.Timer(0.5, abort.cancel).start()
    started = time.monotonic()
    with pytest.raises(CallCancelled):
        safe_request("GET", server.url("/slow?delay=20"), timeout=60,
                     allow_hosts=[server.host_port], pools=pools, abort=abort)  # fmt: skip
    assert time.monotonic() - started < 0.5 + 0.6


def test_the_least_recently_used_pool_is_closed(
    server: LocalServer, other_server: LocalServer
) -> None:
    pools = GuardedPools(max_pools=1)
    allow = [server.host_port, other_server.host_port]
    safe_request("GET", server.url("/a"), allow_hosts=allow, pools=pools)
    safe_request("GET", other_server.url("/a"), allow_hosts=allow, pools=pools)
    safe_request("GET", server.url("/a"), allow_hosts=allow, pools=pools)
    assert len(set(ports(server))) == 2  # its first pool was evicted and closed
    pools.close()


def test_an_http_tool_uses_the_context_pools(server: LocalServer, pools: GuardedPools) -> None:
    spec = InlineTool(
        name="echo",
        description="echo",
        read_only=True,
        parameters={"type": "object", "properties": {"id": {"type": "string"}}},
        http=HttpToolSpec(method="GET", url=server.url("/items/{id}")),
    )
    remote = HttpTool(spec)
    ctx = ToolContext(run_id="r", call_id="c", allow_hosts=(server.host_port,), http=pools)
    for i in range(3):
        remote.execute({"id": str(i)}, ctx)
    assert len(set(ports(server))) == 1
