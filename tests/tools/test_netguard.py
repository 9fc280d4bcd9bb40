"""The SSRF guard against real local servers: addresses, DNS, redirects, size and time caps."""

from __future__ import annotations

import json
import socket
import ssl
import time
from typing import Any

import httpx
import pytest

from shared.errors import ToolError
from shared.tools import check_url, safe_request

from .conftest import Certs, FakeDns, LocalServer


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://127.0.0.1/", "loopback"),
        ("http://127.1:8080/", "loopback"),
        ("http://2130706433/", "loopback"),
        ("http://[::1]/", "loopback"),
        ("http://[::ffff:127.0.0.1]/", "loopback"),
        ("http://[64:ff9b::7f00:1]/", "loopback"),
        ("http://localhost/", "loopback"),
        ("http://LOCALHOST./x", "loopback"),
        ("http://0.0.0.0/", "unspecified"),
        ("http://[::]/", "unspecified"),
        ("http://169.254.169.254/latest/meta-data/", "cloud metadata"),
        ("http://[fd00:ec2::254]/", "cloud metadata"),
        ("http://100.100.100.200/", "cloud metadata"),
        ("http://169.254.1.1/", "link-local"),
        ("http://[fe80::1]/", "link-local"),
        ("http://10.1.2.3/", "private"),
        ("http://172.16.0.1/", "private"),
        ("http://192.168.1.1/", "private"),
        ("http://[fd12:3456::1]/", "private"),
        ("http://100.64.0.1/", "non-public"),
        ("http://224.0.0.1/", "multicast"),
        ("http://240.0.0.1/", "private|reserved"),
    ],
)
def test_internal_addresses_are_refused(url: str, reason: str) -> None:
    with pytest.raises(ToolError, match=rf"blocked URL: .*\(({reason}) address"):
        check_url(url)


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://example.com/", "gopher://x/", "x"])
def test_only_http_and_https(url: str) -> None:
    with pytest.raises(ToolError, match="only http and https|invalid URL"):
        check_url(url)


def test_public_addresses_pass(fake_dns: FakeDns) -> None:
    fake_dns({"public.test": ["93.184.216.34", "2606:2800:220:1::1"]})
    check_url("http://93.184.216.34/")
    check_url("https://public.test/path?q=1")


def test_names_resolving_inside_are_refused(fake_dns: FakeDns) -> None:
    fake_dns({"inside.test": ["10.0.0.5"], "mixed.test": ["93.184.216.34", "127.0.0.1"]})
    with pytest.raises(ToolError, match=r"inside.test resolves to 10.0.0.5 \(private"):
        check_url("http://inside.test/")
    with pytest.raises(ToolError, match=r"mixed.test resolves to 127.0.0.1 \(loopback"):
        check_url("http://mixed.test/")  # ANY bad address is enough


def test_unresolvable_host() -> None:
    with pytest.raises(ToolError, match="cannot resolve host"):
        check_url("http://does-not-exist.invalid/")


def test_allow_list_by_host_port_and_wildcard(fake_dns: FakeDns) -> None:
    fake_dns({"api.corp.test": ["10.0.0.7"]})
    check_url("http://127.0.0.1:8080/", ["127.0.0.1:8080"])
    check_url("http://127.0.0.1:9999/", ["127.0.0.1"])
    check_url("http://[::1]:8080/", ["[::1]:8080"])
    check_url("http://API.corp.test/", ["*.corp.test"])
    check_url("https://api.corp.test/", ["api.corp.test:443"])
    with pytest.raises(ToolError, match="blocked"):
        check_url("http://127.0.0.1:9090/", ["127.0.0.1:8080"])
    with pytest.raises(ToolError, match="blocked"):
        check_url("http://api.corp.test/", ["corp.test", "api.corp.test:8443"])


def test_request_to_a_local_server_is_refused(server: LocalServer) -> None:
    with pytest.raises(ToolError, match="loopback"):
        safe_request("GET", server.url("/echo"))
    assert server.requests == []


def test_allow_listed_local_server_works(server: LocalServer) -> None:
    response = safe_request(
        "POST",
        server.url("/echo"),
        headers={"X-Test": "1"},
        params={"a": "b"},
        json={"k": "v"},
        allow_hosts=[server.host_port],
    )
    assert response.status_code == 200
    echo = response_json(response.text)
    assert echo["method"] == "POST" and echo["query"] == {"a": ["b"]}
    assert echo["headers"]["host"] == server.host_port
    assert echo["headers"]["x-test"] == "1"
    assert echo["headers"]["content-type"] == "application/json"
    assert response_json(echo["body"]) == {"k": "v"}
    assert response.content_type == "application/json"
    assert response.url == server.url("/echo?a=b")


def test_redirect_to_a_non_allow_listed_loopback_port_is_refused(
    server: LocalServer, other_server: LocalServer
) -> None:
    target = other_server.url("/echo")
    with pytest.raises(ToolError, match=r"blocked URL: 127.0.0.1 \(loopback"):
        safe_request("GET", server.url(f"/redirect?to={target}"), allow_hosts=[server.host_port])
    assert [r.path for r in server.requests] == ["/redirect"]
    assert other_server.requests == []


def test_redirect_to_a_name_resolving_inside_is_refused(
    server: LocalServer, fake_dns: FakeDns
) -> None:
    fake_dns({"evil.test": ["169.254.169.254"]})
    with pytest.raises(ToolError, match="cloud metadata"):
        safe_request(
            "GET",
            server.url("/redirect?to=http://evil.test/latest/meta-data/"),
            allow_hosts=[server.host_port],
        )


def test_redirect_to_another_scheme_is_refused(server: LocalServer) -> None:
    with pytest.raises(ToolError, match="only http and https"):
        safe_request(
            "GET", server.url("/redirect?to=file:///etc/passwd"), allow_hosts=[server.host_port]
        )


def test_redirects_are_followed_and_limited(server: LocalServer) -> None:
    response = safe_request(
        "GET", server.url("/redirect?to=/echo&code=301"), allow_hosts=[server.host_port]
    )
    assert response_json(response.text)["path"] == "/echo"
    assert response.url == server.url("/echo")
    with pytest.raises(ToolError, match="too many redirects"):
        safe_request("GET", server.url("/loop"), allow_hosts=[server.host_port])
    assert len(server.requests) == 2 + 6


def test_redirect_methods(server: LocalServer) -> None:
    allow = [server.host_port]
    seen_303 = safe_request(
        "POST", server.url("/redirect?to=/echo&code=303"), json={}, allow_hosts=allow
    )
    assert response_json(seen_303.text)["method"] == "GET"
    seen_307 = safe_request(
        "POST", server.url("/redirect?to=/echo&code=307"), json={"x": 1}, allow_hosts=allow
    )
    echo = response_json(seen_307.text)
    assert echo["method"] == "POST" and response_json(echo["body"]) == {"x": 1}


def test_credentials_do_not_follow_a_redirect_to_another_origin(
    server: LocalServer, other_server: LocalServer
) -> None:
    headers = {"Authorization": "Bearer secret", "X-Api-Key": "k", "Accept": "text/plain"}
    allow = [server.host_port, other_server.host_port]
    same = safe_request("GET", server.url("/redirect?to=/echo"), headers=headers, allow_hosts=allow)
    assert response_json(same.text)["headers"]["authorization"] == "Bearer secret"
    target = other_server.url("/echo")
    moved = safe_request(
        "GET", server.url(f"/redirect?to={target}"), headers=headers, allow_hosts=allow
    )
    seen = response_json(moved.text)["headers"]
    assert "authorization" not in seen and "x-api-key" not in seen
    assert seen["accept"] == "text/plain"


def test_response_size_cap(server: LocalServer) -> None:
    allow = [server.host_port]
    assert (
        len(
            safe_request(
                "GET", server.url("/big?n=1000"), max_bytes=1000, allow_hosts=allow
            ).content
        )
        == 1000
    )
    with pytest.raises(ToolError, match=r"response too large \(limit 1000 bytes\)"):
        safe_request("GET", server.url("/big?n=1001"), max_bytes=1000, allow_hosts=allow)
    with pytest.raises(ToolError, match="response too large"):  # no Content-Length: streamed
        safe_request("GET", server.url("/stream?n=2000000"), max_bytes=10_000, allow_hosts=allow)


def test_size_cap_applies_to_decoded_content(server: LocalServer) -> None:
    allow = [server.host_port]
    assert safe_request("GET", server.url("/gzip"), allow_hosts=allow).text == "hello " * 1000
    with pytest.raises(ToolError, match="response too large"):
        safe_request("GET", server.url("/gzip"), max_bytes=3000, allow_hosts=allow)


def test_total_time_cap_stops_a_trickle(server: LocalServer) -> None:
    # a byte every 0.9 s: each read is within its read timeout; only the watchdog (shutting
    # the socket at the deadline) ends the exchange at 1 s rather than at the 2nd byte (1.8 s)
    started = time.monotonic()
    with pytest.raises(ToolError, match=r"timed out after 1s"):
        safe_request(
            "GET", server.url("/slow?delay=0.9"), timeout=1.0, allow_hosts=[server.host_port]
        )
    assert time.monotonic() - started < 1.4


def test_connection_refused_is_a_tool_error(server: LocalServer) -> None:
    with pytest.raises(ToolError, match="request to 127.0.0.1 failed"):
        safe_request("GET", "http://127.0.0.1:1/", allow_hosts=["127.0.0.1:1"])


def test_connects_to_the_checked_address_not_a_fresh_lookup(
    server: LocalServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = socket.getaddrinfo
    lookups: list[str] = []

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host != "rebind.test":
            return real(host, port, *args, **kwargs)
        lookups.append(host)
        if len(lookups) > 1:  # a second lookup is the DNS-rebinding window
            raise socket.gaierror("rebound")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    url = f"http://rebind.test:{server.port}/echo"
    response = safe_request("GET", url, allow_hosts=[f"rebind.test:{server.port}"])
    assert lookups == ["rebind.test"]
    assert response_json(response.text)["headers"]["host"] == f"rebind.test:{server.port}"


def test_tls_is_verified_against_the_host_name(
    tls_server: LocalServer, certs: Certs, fake_dns: FakeDns
) -> None:
    fake_dns({"tool.test": ["127.0.0.1"], "other.test": ["127.0.0.1"]})
    verify = ssl.create_default_context(cafile=str(certs.ca))
    with httpx.Client(verify=verify, trust_env=False) as client:
        url = f"https://tool.test:{tls_server.port}/echo"
        response = safe_request("GET", url, allow_hosts=["tool.test"], client=client)
        assert response_json(response.text)["headers"]["host"] == f"tool.test:{tls_server.port}"
        with pytest.raises(ToolError, match="CERTIFICATE_VERIFY_FAILED|certificate"):
            safe_request(
                "GET",
                f"https://other.test:{tls_server.port}/echo",
                allow_hosts=["other.test"],
                client=client,
            )


def response_json(text: str) -> Any:
    return json.loads(text)
