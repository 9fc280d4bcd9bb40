"""SSRF guard for tools that fetch URLs.

``check_url`` refuses non-http(s) URLs and hosts that resolve to any private, loopback,
link-local, multicast, reserved, unspecified or cloud-metadata address, unless the host is
allow-listed (``"host"``, ``"host:port"`` or ``"*.domain"``).

``safe_request`` checks every hop (redirects are followed by hand) and connects to the very
address it checked: the URL's host is replaced by that IP, while the ``Host`` header and the
TLS server name (SNI, certificate check) keep the real host name. A DNS answer that changes
between check and connect (rebinding) therefore cannot redirect the connection.

Connections are kept alive in ``GuardedPools`` (a worker holds one, ``Runtime.http_pools``):
one pool per (scheme, checked address, port, TLS name), so a connection only ever serves
requests whose host was checked, at that moment, to that very address, and a TLS connection
verified for one name never serves another. Without ``pools`` a call connects afresh (its
own pools, closed after it). A caller's own ``client`` pools by address alone: its
connections are not kept alive (``Connection: close``).

Limits: the body is streamed and cut at ``max_bytes``; ``timeout`` caps the whole exchange
(connect, redirects, body): every socket step through the guarded transport is bounded by the
time left (a slow trickle cannot outlive it) and the process's abort watchdog
(``shared.llm.abort``) shuts the socket when it runs out — as it does when the caller's
``Abort`` fires. A caller's own ``client`` bypasses that transport: a timer thread shuts its
socket at the deadline. DNS resolution itself uses the system resolver and its own timeouts.
Proxies from the environment are not used.

``GuardedBackend`` applies the same rule to a long-lived, pooled client (a tenant's model
endpoint): each new connection resolves and checks the host and connects to the checked
address, while TLS still verifies the real host name.
"""

from __future__ import annotations

import codecs
import contextlib
import ipaddress
import json as jsonlib
import re
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import httpcore
import httpx

from shared.errors import BlockedAddress, ToolError
from shared.llm.abort import Abort, abortable_transport
from shared.llm.abort import current as current_abort
from shared.llm.backend import Connect, OverBackend

__all__ = [
    "GuardedBackend",
    "GuardedPools",
    "MAX_REDIRECTS",
    "METADATA_ADDRESSES",
    "SafeResponse",
    "check_url",
    "deny_reason",
    "pinned_address",
    "safe_request",
    "tls_server_name",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

MAX_REDIRECTS = 5
METADATA_ADDRESSES: frozenset[IPAddress] = frozenset(
    ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200")
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
# headers that may follow a redirect to another origin; credentials and the like do not
_CROSS_ORIGIN_HEADERS = frozenset({"accept", "accept-language", "content-type", "user-agent"})
_CHARSET = re.compile(r"charset=[\"']?([\w.:-]+)", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class SafeResponse:
    """A fully read response. ``content`` is decoded (gzip...) and at most ``max_bytes``."""

    status_code: int
    headers: httpx.Headers
    content: bytes
    url: str  # the final URL, after redirects

    @property
    def content_type(self) -> str:
        value: str = self.headers.get("content-type", "")
        return value.split(";", 1)[0].strip().lower()

    @property
    def text(self) -> str:
        found = _CHARSET.search(self.headers.get("content-type", ""))
        encoding = found.group(1) if found else "utf-8"
        try:
            codecs.lookup(encoding)
        except LookupError:
            encoding = "utf-8"
        return self.content.decode(encoding, errors="replace")


def check_url(url: str, allow_hosts: Sequence[str] = ()) -> None:
    """Raise ToolError unless ``url`` is http(s) and its host is public or allow-listed."""
    _checked_address(_parse(url), allow_hosts)


def pinned_address(url: str, allow_hosts: Sequence[str] = ()) -> str:
    """The checked address to connect to for ``url`` (ToolError as ``check_url``): a client
    that connects there, with the real host name in ``Host`` and ``tls_server_name`` as the
    TLS name, cannot be redirected by a DNS answer that changes after the check."""
    return _checked_address(_parse(url), allow_hosts)


def tls_server_name(url: str) -> str | None:
    """The name TLS must verify for ``url`` when connecting to its pinned address (SNI)."""
    return _tls_name(_parse(url)).get("sni_hostname")


def deny_reason(ip: IPAddress) -> str | None:
    """Why ``ip`` must not be reached (e.g. ``"loopback"``), or None for a public address."""
    if ip in METADATA_ADDRESSES:
        return "cloud metadata"
    embedded = _embedded_v4(ip)
    reason = deny_reason(embedded) if embedded is not None else None
    checks = (
        ("loopback", ip.is_loopback),
        ("unspecified", ip.is_unspecified),
        ("link-local", ip.is_link_local),
        ("multicast", ip.is_multicast),
        ("private", ip.is_private),
        ("reserved", ip.is_reserved),
        ("non-public", not ip.is_global),
    )
    return reason or next((label for label, hit in checks if hit), None)


def _embedded_v4(ip: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address inside an IPv4-mapped, NAT64 or 6to4 IPv6 address."""
    if isinstance(ip, ipaddress.IPv4Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip.sixtofour


def _parse(url: str | httpx.URL) -> httpx.URL:
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError) as exc:
        raise ToolError(f"invalid URL: {exc}") from None
    if parsed.scheme not in ("http", "https"):
        raise ToolError(f"only http and https URLs are allowed, not {parsed.scheme or 'none'!r}")
    if not parsed.raw_host:
        raise ToolError("the URL has no host")
    return parsed


def _host(url: httpx.URL) -> str:
    return url.raw_host.decode("ascii").lower().rstrip(".")


def _port(url: httpx.URL) -> int:
    return url.port or (443 if url.scheme == "https" else 80)


def _allowed(host: str, port: int, allow_hosts: Sequence[str]) -> bool:
    netloc_host = f"[{host}]" if ":" in host else host
    candidates = {host, f"{netloc_host}:{port}"}
    for entry in (e.strip().lower() for e in allow_hosts):
        if entry in candidates or (entry.startswith("*.") and host.endswith(entry[1:])):
            return True
    return False


def _checked_address(url: httpx.URL, allow_hosts: Sequence[str]) -> str:
    """The address to connect to, after checking every address the host resolves to."""
    return _checked_host(_host(url), _port(url), allow_hosts)


def _checked_host(host: str, port: int, allow_hosts: Sequence[str]) -> str:
    addresses = _resolve(host, port)
    if not _allowed(host, port, allow_hosts):
        for ip in addresses:
            reason = deny_reason(ip)
            if reason is not None:
                where = host if host == str(ip) else f"{host} resolves to {ip}"
                raise BlockedAddress(f"blocked URL: {where} ({reason} address; not allow-listed)")
    return str(addresses[0])


def _literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _resolve(host: str, port: int) -> list[IPAddress]:
    literal = _literal(host)
    if literal is not None:
        return [literal]
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise ToolError(f"cannot resolve host {host}: {exc}") from None
    found = [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]
    if not found:
        raise ToolError(f"cannot resolve host {host}")
    return found


Watch = Callable[[httpx.Headers], Callable[[bytes], None] | None]
"""Given a response's headers, maybe a callback for each piece of its body as it arrives."""


@dataclass(frozen=True, slots=True)
class _Hop:
    method: str
    url: httpx.URL
    headers: httpx.Headers
    body: bytes | None


@dataclass(frozen=True, slots=True)
class _Limits:
    timeout: float
    deadline: float  # time.monotonic()
    max_bytes: int
    allow_hosts: tuple[str, ...]
    watch: Watch | None = None

    def remaining(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise self.timed_out()
        return left

    def timed_out(self) -> ToolError:
        return ToolError(f"request timed out after {self.timeout:g}s")


class _Origin(NamedTuple):
    """What a kept-alive connection is for: the checked address it connects to and the TLS
    name it verified (None: plain HTTP, or an address literal)."""

    scheme: str
    address: str
    port: int
    tls_name: str | None


class _Connections(Protocol):
    """Where a hop's client comes from. ``keyed``: its connections serve one ``_Origin`` only
    (so they may be kept alive, and the guarded transport times every socket step)."""

    keyed: bool

    def lease(self, origin: _Origin) -> contextlib.AbstractContextManager[httpx.Client]: ...


@dataclass(eq=False)
class _Pool:
    client: httpx.Client
    users: int = 0
    evicted: bool = False


@dataclass(eq=False)
class GuardedPools:
    """Kept-alive connections for guarded requests: one pool per ``_Origin`` (scheme, checked
    address, port, TLS name), the ``max_pools`` most recently used (an evicted pool closes
    once its last request ends). Each pool's connections obey the calling thread's ``Abort``
    (``abortable_transport``); a pool never makes a request wait for a connection (no cap
    below the worker's concurrency); ``keepalive`` idle connections each, for
    ``keepalive_expiry`` seconds. Thread-safe."""

    max_pools: int = 32
    keepalive: int = 8
    keepalive_expiry: float = 5.0
    keyed: bool = field(default=True, init=False)
    _pools: OrderedDict[_Origin, _Pool] = field(default_factory=OrderedDict, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    @contextmanager
    def lease(self, origin: _Origin) -> Iterator[httpx.Client]:
        pool, evicted = self._take(origin)
        for old in evicted:
            old.client.close()
        try:
            yield pool.client
        finally:
            with self._lock:
                pool.users -= 1
                done = pool.evicted and pool.users == 0
            if done:
                pool.client.close()

    def _take(self, origin: _Origin) -> tuple[_Pool, list[_Pool]]:
        with self._lock:
            pool = self._pools.get(origin)
            if pool is None:
                pool = self._pools[origin] = _Pool(self._client())
            self._pools.move_to_end(origin)
            pool.users += 1
            evicted: list[_Pool] = []
            while len(self._pools) > self.max_pools:
                _, old = self._pools.popitem(last=False)
                old.evicted = True
                if old.users == 0:
                    evicted.append(old)
            return pool, evicted

    def _client(self) -> httpx.Client:
        limits = httpx.Limits(
            max_connections=None,
            max_keepalive_connections=self.keepalive,
            keepalive_expiry=self.keepalive_expiry,
        )
        return httpx.Client(transport=abortable_transport(limits=limits))

    def close(self) -> None:
        """Close every pool (requests still running keep theirs until they end)."""
        with self._lock:
            pools, self._pools = list(self._pools.values()), OrderedDict()
            for pool in pools:
                pool.evicted = True
            idle = [p for p in pools if p.users == 0]
        for pool in idle:
            pool.client.close()


@dataclass(eq=False)
class _CallersClient:
    """A caller's own client: pooled by address alone, so never kept alive."""

    client: httpx.Client
    keyed: bool = False

    @contextmanager
    def lease(self, origin: _Origin) -> Iterator[httpx.Client]:
        yield self.client


def safe_request(
    method: str,
    url: str,
    *,
    headers: Mapping[str, str] | None = None,
    params: Mapping[str, Any] | None = None,
    json: Any = None,
    timeout: float = 30.0,
    max_bytes: int = 1_000_000,
    allow_hosts: Sequence[str] = (),
    client: httpx.Client | None = None,
    pools: GuardedPools | None = None,
    abort: Abort | None = None,
    watch: Watch | None = None,
) -> SafeResponse:
    """One guarded HTTP exchange; every failure is a ToolError with a readable message, except
    that a fired ``abort`` ends it at once with its ``Aborted`` error. ``pools``: kept-alive
    connections to reuse (None: connect afresh); ``client``: the caller's own (no keep-alive).
    ``watch``: given the final response's headers, maybe a callback that sees each piece of
    its body as it arrives (a streamed body's progress), before the whole body is returned."""
    handle = abort or Abort()
    limits = _Limits(timeout, time.monotonic() + timeout, max_bytes, tuple(allow_hosts), watch)
    hop = _first_hop(method, url, headers, params, json)
    try:
        with handle.bound():
            if client is not None:
                return _exchange(_CallersClient(client), hop, limits)
            with _timed(handle, limits) as timer:
                try:
                    return _guarded(pools, hop, limits)
                except ToolError:
                    if timer.fired and not handle.fired:  # its deadline shut the socket
                        raise limits.timed_out() from None
                    raise
    except ToolError:
        handle.check()  # a shut socket surfaces as a failed request: say why
        raise


def _guarded(pools: GuardedPools | None, hop: _Hop, limits: _Limits) -> SafeResponse:
    """The exchange over ``pools``' kept-alive connections, or over its own (closed after)."""
    if pools is not None:
        return _exchange(pools, hop, limits)
    own = GuardedPools(max_pools=MAX_REDIRECTS + 1, keepalive=0)
    try:
        return _exchange(own, hop, limits)
    finally:
        own.close()


@contextmanager
def _timed(caller: Abort, limits: _Limits) -> Iterator[Abort]:
    """The block works for a handle that fires at the exchange's deadline (or the caller's,
    if sooner) and when the caller's fires: the guarded transport bounds each socket step by
    its time left, and the abort watchdog shuts the socket when it fires (no thread per
    call)."""
    deadline = time.time() + (limits.deadline - time.monotonic())
    if caller.deadline_at is not None:
        deadline = min(deadline, caller.deadline_at)
    timer = Abort(deadline)
    with caller.closing(lambda: timer.cancel(str(caller.error()))), timer.bound():
        yield timer


def _first_hop(
    method: str,
    url: str,
    headers: Mapping[str, str] | None,
    params: Mapping[str, Any] | None,
    json: Any,
) -> _Hop:
    parsed = _parse(url)
    if params:
        parsed = parsed.copy_merge_params(dict(params))
    hop_headers = httpx.Headers(headers)
    body = None
    if json is not None:
        body = jsonlib.dumps(json, ensure_ascii=False).encode()
        hop_headers.setdefault("Content-Type", "application/json")
    return _Hop(method.upper(), parsed, hop_headers, body)


def _exchange(connections: _Connections, hop: _Hop, limits: _Limits) -> SafeResponse:
    for _ in range(MAX_REDIRECTS + 1):
        address = _checked_address(hop.url, limits.allow_hosts)
        origin = _Origin(
            hop.url.scheme, address, _port(hop.url), _tls_name(hop.url).get("sni_hostname")
        )
        with connections.lease(origin) as client:
            response = _send(client, hop, address, limits, keep_alive=connections.keyed)
            try:
                location = response.headers.get("location")
                if response.status_code not in _REDIRECTS or not location:
                    return _read(response, hop.url, limits, watched=connections.keyed)
                hop = _redirected(hop, response.status_code, location)
            finally:
                response.close()
    raise ToolError(f"too many redirects (more than {MAX_REDIRECTS})")


def _send(
    client: httpx.Client, hop: _Hop, address: str, limits: _Limits, *, keep_alive: bool
) -> httpx.Response:
    headers = hop.headers.copy()
    headers["Host"] = hop.url.netloc.decode("ascii")
    if not keep_alive:
        # A caller's client pools connections by the pinned IP, not by the TLS name they were
        # verified for: never leave one open for a request to another host name to reuse.
        headers["Connection"] = "close"
    request = client.build_request(
        hop.method,
        hop.url.copy_with(host=address),  # connect to the checked address (no rebinding)
        headers=headers,
        content=hop.body,
        timeout=limits.remaining(),
        extensions=_tls_name(hop.url),
    )
    try:
        return client.send(request, stream=True, follow_redirects=False)
    except httpx.TimeoutException:
        raise limits.timed_out() from None
    except httpx.HTTPError as exc:
        raise ToolError(f"request to {_host(hop.url)} failed: {exc}") from None


def _tls_name(url: httpx.URL) -> dict[str, Any]:
    """SNI and certificate check against the real host name, not the pinned address."""
    host = _host(url)
    if url.scheme != "https" or _literal(host) is not None:
        return {}
    return {"sni_hostname": host}


def _redirected(hop: _Hop, status: int, location: str) -> _Hop:
    try:
        url = _parse(hop.url.join(location))
    except httpx.InvalidURL as exc:
        raise ToolError(f"invalid redirect location: {exc}") from None
    method, body, headers = hop.method, hop.body, hop.headers.copy()
    if (status == 303 and method != "HEAD") or (status in (301, 302) and method == "POST"):
        method, body = "GET", None
        headers.pop("content-type", None)
    if (url.scheme, _host(url), _port(url)) != (hop.url.scheme, _host(hop.url), _port(hop.url)):
        headers = httpx.Headers({k: v for k, v in headers.items() if k in _CROSS_ORIGIN_HEADERS})
    return _Hop(method, url, headers, body)


def _read(
    response: httpx.Response, url: httpx.URL, limits: _Limits, *, watched: bool
) -> SafeResponse:
    """The body, at most ``max_bytes``, by the deadline. ``watched``: the guarded transport
    bounds each read by the time left (otherwise a timer shuts the socket at the deadline)."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limits.max_bytes:
        raise _too_large(limits)
    chunks: list[bytes] = []
    size = 0
    seen = limits.watch(response.headers) if limits.watch is not None else None
    try:
        with contextlib.nullcontext() if watched else _watchdog(response, limits):
            for chunk in response.iter_bytes():
                size += len(chunk)
                if size > limits.max_bytes:
                    raise _too_large(limits)
                chunks.append(chunk)
                if seen is not None:
                    seen(chunk)
                limits.remaining()
    except httpx.HTTPError as exc:
        limits.remaining()  # a shutdown at the deadline surfaces as a broken stream: say so
        raise ToolError(f"reading the response failed: {exc}") from None
    return SafeResponse(response.status_code, response.headers, b"".join(chunks), str(url))


def _too_large(limits: _Limits) -> ToolError:
    return ToolError(f"response too large (limit {limits.max_bytes} bytes)")


@contextmanager
def _watchdog(response: httpx.Response, limits: _Limits) -> Iterator[None]:
    """Shut the socket of a caller's own client down at the deadline, so a slow trickle
    cannot outlive ``timeout``."""
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if not isinstance(sock, socket.socket):
        yield
        return
    timer = threading.Timer(limits.remaining(), _shutdown, (sock,))
    timer.daemon = True
    timer.start()
    abort = current_abort()  # a client of the caller's own bypasses the watched transport
    try:
        with abort.closing(lambda: _shutdown(sock)) if abort else contextlib.nullcontext():
            yield
    finally:
        timer.cancel()


class GuardedBackend(OverBackend):
    """An httpcore network backend that connects only where the SSRF rules allow, to the
    address it checked; otherwise it raises ``refuse(message)`` (the caller's error type)."""

    def __init__(
        self,
        allow_hosts: Sequence[str] = (),
        inner: httpcore.NetworkBackend | None = None,
        refuse: Callable[[str], Exception] = ToolError,
    ) -> None:
        super().__init__(inner)
        self._allow_hosts = tuple(allow_hosts)
        self._refuse = refuse

    def _tcp(
        self, host: str, port: int, timeout: float | None, connect: Connect
    ) -> httpcore.NetworkStream:
        name = host.lower().rstrip(".").strip("[]")
        try:
            address = _checked_host(name, port, self._allow_hosts)
        except ToolError as exc:
            raise self._refuse(str(exc)) from None
        return connect(address, timeout)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        raise self._refuse("unix sockets are not reachable through the SSRF guard")


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)  # the base method, also for SSL sockets
