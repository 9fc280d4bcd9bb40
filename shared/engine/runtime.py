"""What the engine needs from the outside world, injected: database, publisher, live bus."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

from sqlalchemy.engine import Engine

from shared.agent.spec import ModelProfile
from shared.config import Settings
from shared.engine.cache import RunCaches
from shared.engine.envelopes import Envelopes
from shared.engine.gate import Gate
from shared.engine.leases import Heartbeat, heartbeat_for
from shared.engine.livebus import WAKE, InProcessBus, LiveBus
from shared.engine.pacer import Pacer
from shared.engine.standby import Standby
from shared.engine.stopper import Stopper
from shared.interop.webhooks import RENDERERS
from shared.llm.ratelimit import LocalLimiter, RateLimiter
from shared.llm.tool_modes import ToolModes
from shared.store import store_for
from shared.store.deliveries import Renderer
from shared.store.write import Store
from shared.tools.confinement import Confinement
from shared.tools.mcp_lists import ToolLists
from shared.tools.netguard import GuardedPools

__all__ = ["Dispatch", "Publisher", "Runtime"]

log = logging.getLogger("treadle.live")


@dataclass(frozen=True, slots=True)
class Dispatch:
    """A doorbell for the broker: "look at this run (call, delivery) at this version". The
    database says whether there is anything to do; a stale or duplicate dispatch is dropped."""

    kind: Literal["round", "tool", "webhook"]
    run_id: str
    version: int = 0
    call_id: str | None = None
    delivery_id: str | None = None
    outbox_id: int | None = None  # webhooks: their outbox row
    countdown: float | None = None  # not before this many seconds
    attempt: int = 0  # rounds: transient model failures so far
    priority: int | None = None  # the broker message priority, 0-9 (None: the default)

    @classmethod
    def round(
        cls,
        run_id: str,
        version: int,
        countdown: float | None = None,
        attempt: int = 0,
        priority: int | None = None,
    ) -> Dispatch:
        return cls(
            "round", run_id, version, countdown=countdown, attempt=attempt, priority=priority
        )

    @classmethod
    def tool(
        cls,
        run_id: str,
        call_id: str,
        version: int,
        priority: int | None = None,
        countdown: float | None = None,
    ) -> Dispatch:
        return cls("tool", run_id, version, call_id=call_id, priority=priority, countdown=countdown)


class Publisher(Protocol):
    def __call__(self, items: list[Dispatch]) -> None: ...


@dataclass
class Runtime:
    engine: Engine
    settings: Settings
    publish: Publisher
    live: LiveBus = field(default_factory=InProcessBus)
    profiles: dict[str, ModelProfile] = field(default_factory=dict)
    limiter: RateLimiter = field(default_factory=LocalLimiter)
    queue_depth: Callable[[], dict[str, int] | None] | None = None  # broker messages waiting
    envelopes: Envelopes = field(default_factory=Envelopes)  # tenants with spend envelopes
    stopper: Stopper = field(default_factory=Stopper)  # this process's work in flight, by run
    caches: RunCaches = field(default_factory=RunCaches)  # what it holds of the runs it works on
    # the facades' webhook body renderers, by the name a run's webhook gives
    renderers: Mapping[str, Renderer] = field(default_factory=lambda: RENDERERS)
    pacer: Pacer = field(default_factory=Pacer)  # what this process does at most every so often
    # process state shared by copies (``replace``): engine admission, MCP tool lists (bounded
    # in bytes), the slots and cgroups of tenants' child processes, learnt tool modes, the
    # kept-alive connections of guarded HTTP calls (inline HTTP tools), the threads kept for
    # tool calls
    _gate: Gate | None = field(default=None, repr=False)
    _mcp_lists: ToolLists | None = field(default=None, repr=False)
    _confinement: Confinement | None = field(default=None, repr=False)
    _tool_modes: ToolModes | None = field(default=None, repr=False)
    _http_pools: GuardedPools | None = field(default=None, repr=False)
    _tool_threads: Standby | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        s = self.settings
        if self._gate is None:
            self._gate = Gate(s.worker_engine_slots)
        if self._mcp_lists is None:
            self._mcp_lists = ToolLists(s.mcp_cache_bytes, tenant_waiters=s.mcp_tenant_waiters)
        if self._confinement is None:
            self._confinement = Confinement.from_settings(s)
        if self._tool_modes is None:
            self._tool_modes = ToolModes(s.tool_mode_ttl_s)
        if self._http_pools is None:
            self._http_pools = GuardedPools()
        if self._tool_threads is None:
            self._tool_threads = Standby()

    @property
    def store(self) -> Store:
        """The store's face for this engine's dialect (``shared.store.write``)."""
        return store_for(self.engine)

    @property
    def gate(self) -> Gate:
        """Engine work admission of a worker process (``shared.engine.gate``)."""
        assert self._gate is not None
        return self._gate

    @property
    def mcp_lists(self) -> ToolLists:
        """MCP servers' tool lists this process holds (``shared.tools.mcp_lists``)."""
        assert self._mcp_lists is not None
        return self._mcp_lists

    @property
    def confinement(self) -> Confinement:
        """Sandboxes' and PDF readers' slots and cgroups (``shared.tools.confinement``)."""
        assert self._confinement is not None
        return self._confinement

    @property
    def tool_modes(self) -> ToolModes:
        """What ``tool_mode: auto`` learnt per profile, for a while (``shared.llm.tool_modes``)."""
        assert self._tool_modes is not None
        return self._tool_modes

    @property
    def http_pools(self) -> GuardedPools:
        """Kept-alive connections of guarded HTTP calls, one pool per checked address and TLS
        name (``shared.tools.netguard``)."""
        assert self._http_pools is not None
        return self._http_pools

    @property
    def tool_threads(self) -> Standby:
        """Threads kept for tool calls (``shared.engine.standby``)."""
        assert self._tool_threads is not None
        return self._tool_threads

    @property
    def heartbeat(self) -> Heartbeat:
        """This process's worker identity and lease keeper on this database."""
        return heartbeat_for(self.engine, self.settings.lease_seconds)

    def wake(self, run_id: str, seq: int | None = None) -> None:
        """After a commit that wrote durable events (up to ``seq``; None = unknown): wake the
        run's SSE tails so they read them at once instead of at their next poll."""
        try:
            self.live.publish(run_id, {"type": WAKE, "seq": seq})
        except Exception:
            log.warning("wake failed for %s", run_id, exc_info=True)
