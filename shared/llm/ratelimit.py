"""Fleet-wide limits per model profile: concurrent requests, requests and tokens per minute,
and a fleet-wide pause after a 429 — shared by every worker through Redis (one Lua call per
acquire), or inside one process in embedded mode.

``acquire`` never blocks: it returns a permit, or how long to wait. A round that must wait
gives its thread back and is retried later (the run holds no thread while it waits).

Keys (``limit_key``): an operator's profile is limited by its name, for every tenant that
names it; a profile that came inline in a spec by tenant, name, endpoint and model, so one
tenant's endpoint (and the 429s it answers) never touches another tenant's runs. A pause is
at most ``max_pause`` seconds, whatever ``Retry-After`` said (``TREADLE_RETRY_AFTER_MAX_S``).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = [
    "DEFAULT_MAX_PAUSE_S",
    "Limits",
    "LocalLimiter",
    "Permit",
    "RateLimiter",
    "RedisLimiter",
    "limit_key",
    "limits_of",
]

DEFAULT_MAX_PAUSE_S = 60.0


@dataclass(frozen=True, slots=True)
class Limits:
    max_concurrent: int | None = None
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None

    @property
    def any(self) -> bool:
        return any(
            v is not None
            for v in (self.max_concurrent, self.requests_per_minute, self.tokens_per_minute)
        )


def limit_key(profile: Any, tenant: str) -> str:
    """The fleet-limit key of a model call (see the module doc)."""
    if getattr(profile, "operator", False):
        return str(profile.name)
    return f"inline:{tenant}:{profile.name}:{profile.base_url}|{profile.model}"


def limits_of(profile: Any) -> Limits:
    return Limits(
        getattr(profile, "max_concurrent", None),
        getattr(profile, "requests_per_minute", None),
        getattr(profile, "tokens_per_minute", None),
    )


@dataclass(frozen=True, slots=True)
class Permit:
    key: str
    holder: str | None  # None: no concurrency slot taken
    wait: float = 0.0  # > 0: not granted; retry after this many seconds

    @property
    def granted(self) -> bool:
        return self.wait <= 0


class RateLimiter(Protocol):
    def acquire(self, key: str, limits: Limits, tokens: int, ttl: float) -> Permit: ...

    def release(self, permit: Permit) -> None: ...

    def pause(self, key: str, seconds: float) -> None: ...

    def paused(self, key: str) -> float:
        """Seconds left of the fleet-wide pause of ``key`` (0: not paused)."""
        ...


# KEYS: sem, req, tok, pause   ARGV: now_ms, holder, ttl_ms, max_conc, rpm, tpm, tokens
_ACQUIRE = """
local now = tonumber(ARGV[1])
local pause = redis.call('PTTL', KEYS[4])
if pause > 0 then return pause end
local max_conc, rpm, tpm = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local tokens = tonumber(ARGV[7])
local window = now - 60000
if max_conc > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  if redis.call('ZCARD', KEYS[1]) >= max_conc then
    local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
    return math.min(1000, math.max(50, tonumber(first[2]) - now))
  end
end
if rpm > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', window)
  if redis.call('ZCARD', KEYS[2]) >= rpm then
    local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
    return math.max(50, tonumber(first[2]) - window)
  end
end
if tpm > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', window)
  local used = 0
  for _, m in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
    used = used + tonumber(string.match(m, '^(%d+):'))
  end
  if used > 0 and used + tokens > tpm then
    local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
    return math.max(50, tonumber(first[2]) - window)
  end
  redis.call('ZADD', KEYS[3], now, tokens .. ':' .. ARGV[2])
  redis.call('PEXPIRE', KEYS[3], 61000)
end
if rpm > 0 then
  redis.call('ZADD', KEYS[2], now, ARGV[2])
  redis.call('PEXPIRE', KEYS[2], 61000)
end
if max_conc > 0 then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[2])
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]) + 1000)
end
return 0
"""


class RedisLimiter:
    """Limits shared by all workers. Concurrency slots expire after ``ttl`` (a killed worker
    frees its slot by itself)."""

    def __init__(
        self, url: str, prefix: str = "treadle:limit:", max_pause: float = DEFAULT_MAX_PAUSE_S
    ) -> None:
        import redis

        self._redis = redis.Redis.from_url(url, socket_timeout=5)
        self._script = self._redis.register_script(_ACQUIRE)
        self.prefix = prefix
        self.max_pause = max_pause

    def _keys(self, key: str) -> list[str]:
        p = f"{self.prefix}{key}"
        return [f"{p}:sem", f"{p}:req", f"{p}:tok", f"{p}:pause"]

    def acquire(self, key: str, limits: Limits, tokens: int, ttl: float) -> Permit:
        if not limits.any:
            return Permit(key, None)
        holder = uuid.uuid4().hex
        wait_ms = int(
            self._script(
                keys=self._keys(key),
                args=[
                    int(time.time() * 1000),
                    holder,
                    int(ttl * 1000),
                    limits.max_concurrent or 0,
                    limits.requests_per_minute or 0,
                    limits.tokens_per_minute or 0,
                    max(1, tokens),
                ],
            )
        )
        if wait_ms > 0:
            return Permit(key, None, wait_ms / 1000)
        return Permit(key, holder if limits.max_concurrent else None)

    def release(self, permit: Permit) -> None:
        if permit.holder:
            self._redis.zrem(self._keys(permit.key)[0], permit.holder)

    def pause(self, key: str, seconds: float) -> None:
        seconds = min(seconds, self.max_pause)
        if seconds > 0:
            self._redis.set(self._keys(key)[3], "1", px=int(seconds * 1000))

    def paused(self, key: str) -> float:
        left = int(self._redis.pttl(self._keys(key)[3]))  # -2: no key, -1: no expiry
        return left / 1000 if left > 0 else 0.0


@dataclass
class _Local:
    holders: dict[str, float] = field(default_factory=dict)
    requests: deque[float] = field(default_factory=deque)
    tokens: deque[tuple[float, int]] = field(default_factory=deque)
    paused_until: float = 0.0


class LocalLimiter:
    """The same limits inside one process (embedded mode)."""

    def __init__(self, max_pause: float = DEFAULT_MAX_PAUSE_S) -> None:
        self._state: dict[str, _Local] = {}
        self._lock = threading.Lock()
        self.max_pause = max_pause

    def acquire(self, key: str, limits: Limits, tokens: int, ttl: float) -> Permit:
        if not limits.any:
            return Permit(key, None)
        now = time.time()
        with self._lock:
            st = self._state.setdefault(key, _Local())
            wait = self._wait(st, limits, tokens, now)
            if wait > 0:
                return Permit(key, None, wait)
            holder = uuid.uuid4().hex
            if limits.max_concurrent:
                st.holders[holder] = now + ttl
            st.requests.append(now)
            st.tokens.append((now, tokens))
            return Permit(key, holder if limits.max_concurrent else None)

    @staticmethod
    def _wait(st: _Local, limits: Limits, tokens: int, now: float) -> float:
        if st.paused_until > now:
            return st.paused_until - now
        st.holders = {h: t for h, t in st.holders.items() if t > now}
        while st.requests and st.requests[0] <= now - 60:
            st.requests.popleft()
        while st.tokens and st.tokens[0][0] <= now - 60:
            st.tokens.popleft()
        if limits.max_concurrent and len(st.holders) >= limits.max_concurrent:
            return 0.05
        if limits.requests_per_minute and len(st.requests) >= limits.requests_per_minute:
            return max(0.05, st.requests[0] + 60 - now)
        used = sum(n for _, n in st.tokens)
        if limits.tokens_per_minute and used and used + tokens > limits.tokens_per_minute:
            return max(0.05, st.tokens[0][0] + 60 - now)
        return 0.0

    def release(self, permit: Permit) -> None:
        if permit.holder:
            with self._lock:
                st = self._state.get(permit.key)
                if st is not None:
                    st.holders.pop(permit.holder, None)

    def pause(self, key: str, seconds: float) -> None:
        seconds = min(seconds, self.max_pause)
        with self._lock:
            st = self._state.setdefault(key, _Local())
            st.paused_until = max(st.paused_until, time.time() + seconds)

    def paused(self, key: str) -> float:
        with self._lock:
            st = self._state.get(key)
            return max(0.0, st.paused_until - time.time()) if st is not None else 0.0
