"""What ``tool_mode: auto`` learnt about profiles in this process (SPEC M-7).

A profile whose endpoint answered a request with tools by a 400 *about tools* ("does not
support tools", ``param: tools``...) is in prompt mode for ``ttl_s`` seconds; then native
tools are tried again (an endpoint that was upgraded, or a proxy that changed its mind, gets
them back), at the cost of one 400 if it still rejects them. Held by the ``Runtime``
(``Runtime.tool_modes``), not in the database: a restarted worker learns it again. Bounded:
at most ``max_entries`` profiles (inline profiles are a tenant's to make), the oldest go first.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Literal

from shared.agent.spec import ModelProfile

__all__ = ["DEFAULT_TTL_S", "ToolModes", "WireMode"]

WireMode = Literal["native", "function", "prompt"]
DEFAULT_TTL_S = 600.0
MAX_ENTRIES = 4096


def _key(profile: ModelProfile) -> str:
    # name plus endpoint: inline profiles all share the name "inline"
    return f"{profile.name}|{profile.base_url}|{profile.model}"


class ToolModes:
    """Learnt wire modes by profile, each for ``ttl_s`` seconds (thread-safe)."""

    def __init__(
        self,
        ttl_s: float = DEFAULT_TTL_S,
        max_entries: int = MAX_ENTRIES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        self._max = max_entries
        self._clock = clock
        self._lock = threading.Lock()
        self._modes: OrderedDict[str, tuple[WireMode, float]] = OrderedDict()

    def get(self, profile: ModelProfile) -> WireMode | None:
        """The mode learnt for ``profile`` that has not expired, if any."""
        key = _key(profile)
        with self._lock:
            got = self._modes.get(key)
            if got is None:
                return None
            mode, until = got
            if self._clock() >= until:
                del self._modes[key]
                return None
            return mode

    def remember(self, profile: ModelProfile, mode: WireMode) -> None:
        """``profile`` uses ``mode`` for the next ``ttl_s`` seconds."""
        if self.ttl_s <= 0:
            return
        key = _key(profile)
        with self._lock:
            self._modes.pop(key, None)
            self._modes[key] = (mode, self._clock() + self.ttl_s)
            while len(self._modes) > self._max:
                self._modes.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._modes.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._modes)
