"""Waiting out a provider outage instead of failing the run.

When transient model errors (5xx, 429, timeouts) outlast a round's retries, the run parks as
``waiting`` with ``pending: {"kind": "provider", "profile", "retry_at", ...}`` and a
``wake_at``: it holds no task, no thread and no lease, only its row. The reaper tries it
again at ``wake_at`` (``redrive``) with one model request, backing off each time, until the
profile answers (the run goes on from its last checkpoint) or the run's ``provider_wait_s``
has passed since the outage began (then it fails ``model_error``; a resume can take it up).
While the profile is paused fleet-wide (a 429 with ``Retry-After``, ``shared.llm.ratelimit``)
no waiting run is tried before the pause ends.

The outage's start stays in ``pending`` while a re-drive's round runs; a round that commits
moves the run's round on, and a later outage starts afresh.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from shared.agent.decisions import Fail
from shared.agent.spec import AgentSpec, ModelProfile
from shared.config import Settings
from shared.engine.change import Change, settle
from shared.engine.runtime import Runtime
from shared.engine.transition import attempt, retrying
from shared.engine.tx import Tx
from shared.store import runs as run_store
from shared.store.rows import Run, Status

__all__ = [
    "DEFAULT_WAIT_S",
    "KIND",
    "ProviderDown",
    "provider_wait",
    "redrive",
    "retry_delay",
    "wait_out",
]

log = logging.getLogger("treadle.outage")
KIND = "provider"
DEFAULT_WAIT_S = 1800.0
BACKOFF_CAP = 60  # the delay between tries grows to at most this many times the first


@dataclass(frozen=True)
class ProviderDown:
    """Why a round gave up: its spec and profile, the profile's limiter key, the last error,
    and the attempts it made (a re-drive makes one more)."""

    spec: AgentSpec
    profile: ModelProfile
    key: str
    error: str
    attempt: int


def provider_wait(settings: Settings, spec: AgentSpec, profile: ModelProfile) -> float:
    """How long a run waits out an outage: its spec's ``provider_wait_s``, else its profile's,
    else 1800 s; never more than the operator's ``TREADLE_PROVIDER_WAIT_MAX_S``."""
    chosen = spec.provider_wait_s
    if chosen is None:
        chosen = profile.provider_wait_s
    if chosen is None:
        chosen = DEFAULT_WAIT_S
    return float(min(chosen, settings.provider_wait_max_s))


def retry_delay(settings: Settings, tries: int) -> float:
    """The wait before try number ``tries`` (1 for the first): doubling, capped."""
    factor = min(2.0 ** max(tries - 1, 0), float(BACKOFF_CAP))
    return float(settings.provider_retry_s) * factor


def _outage_of(run: Run) -> dict[str, Any] | None:
    """The outage the run is already waiting out at this round (a re-drive failed again)."""
    pending = run.pending or {}
    if pending.get("kind") == KIND and pending.get("round") == run.round:
        return dict(pending)
    return None


def wait_out(
    rt: Runtime, run: Run, owner: str, down: ProviderDown, billed: Sequence[Mapping[str, Any]] = ()
) -> None:
    """The round holding ``run`` (as ``owner``) gave up on its provider: park the run until
    its next try, or fail it once the outage has lasted its ``provider_wait_s``. ``billed``:
    the calls the round's attempt made that the provider bills (a broken stream's)."""
    ts = run_store.now()
    wait_s = provider_wait(rt.settings, down.spec, down.profile)
    before = _outage_of(run)
    since = float(before["since"]) if before else ts
    tries = int(before["tries"]) + 1 if before else 1
    retry_at = max(ts + retry_delay(rt.settings, tries), ts + rt.limiter.paused(down.key))
    retry_at = min(retry_at, since + wait_s)
    change = Change.by_holder(run, owner)
    change.bill(billed)
    late = run.deadline_at is not None and retry_at >= run.deadline_at
    if ts - since >= wait_s or late:
        reason = f"the model provider did not answer for {ts - since:.0f} s: {down.error}"
        settle(change, Fail(reason=reason, code="model_error"), ts=ts)
    else:
        pending = {
            "kind": KIND,
            "profile": down.profile.name,
            "key": down.key,
            "retry_at": retry_at,
            "since": since,
            "tries": tries,
            "round": run.round,
            "attempt": down.attempt,
            "error": down.error[:500],
        }
        change.values.update(
            status=Status.WAITING.value, pending=pending, wake_at=retry_at, lease_owner=None
        )
        change.event("provider.waiting", pending=pending)
    attempt(rt, lambda tx: tx.apply(change))


def redrive(rt: Runtime, run_id: str) -> bool:
    """The reaper found the run's ``wake_at`` passed: try it again (one model request), or,
    while its profile is paused fleet-wide, look again when the pause ends. True: re-driven."""

    def op(tx: Tx) -> bool:
        run = run_store.load_run(tx.conn, run_id)
        pending = (run.pending or {}) if run is not None else {}
        if run is None or run.status != Status.WAITING or pending.get("kind") != KIND:
            return False
        if pending.get("run_id"):  # a sub-agent's outage, surfaced: the child is tried
            return False
        if run.wake_at is not None and run.wake_at > tx.ts:
            return False
        pause = rt.limiter.paused(str(pending.get("key") or ""))
        if pause > 0:
            tx.apply(Change(run, bump=False, values={"wake_at": tx.ts + pause}))
            return False
        change = Change(run, queue_round=True)
        # the pending outage stays (its start counts on); it shows only while waiting
        change.values.update(status=Status.RUNNING.value, wake_at=None, lease_owner=None)
        change.event("provider.retrying", profile=pending.get("profile"), tries=pending["tries"])
        new = tx.apply(change)
        tries_so_far = int(pending.get("attempt") or 0)  # one request, then park again
        tx.out = [
            replace(d, attempt=tries_so_far) if d.kind == "round" and d.run_id == new.id else d
            for d in tx.out
        ]
        return True

    return retrying(rt, op)
