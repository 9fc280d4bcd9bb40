"""Durable model failover (docs/cost.md).

A profile may name an ordered ``fallback`` list (the operator's profiles). When a round's
call fails past its retries (an outage, 5xx, a 429 beyond the wait, a timeout, a dead port),
the next round goes to the next profile of the chain: the run's loop state records which one
serves (``profile_index``) and since when, in the same transaction as a ``model.failover``
event, so a worker that dies in a failed-over round is replaced by one that calls the same
fallback. Each call's ``/usage`` row names the profile and model that served it and is priced
by that profile; tool mode is detected per profile. After the primary's
``failover_cooldown_s`` the next round tries the primary again. When the chain is exhausted
the run waits out the outage as before (``shared.engine.outage``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from shared.agent.spec import AgentSpec, ModelProfile
from shared.agent.state import LoopState
from shared.engine.change import Change
from shared.engine.runtime import Runtime
from shared.engine.transition import attempt
from shared.llm.profiles import resolve_profile
from shared.store import runs as run_store
from shared.store.rows import Run, Status
from shared.vocab import EventType

__all__ = ["fail_over", "next_profile", "serving"]


def serving(
    spec: AgentSpec, state: LoopState, profiles: Mapping[str, ModelProfile], ts: float
) -> tuple[ModelProfile, LoopState]:
    """The profile that serves the run's next call, and the loop state to commit with it
    (back at the primary once its cool-down has passed)."""
    primary = resolve_profile(spec.model, profiles)
    index = state.profile_index
    if index <= 0 or not primary.fallback:
        return primary, state
    cooled = state.failover_at is None or ts - state.failover_at >= primary.failover_cooldown_s
    if cooled or index > len(primary.fallback):
        return primary, replace(state, profile_index=0, failover_at=None)
    return resolve_profile(primary.fallback[index - 1], profiles), state


def next_profile(
    spec: AgentSpec, state: LoopState, profiles: Mapping[str, ModelProfile]
) -> ModelProfile | None:
    """The profile after the one that just failed, or None (the chain is exhausted)."""
    primary = resolve_profile(spec.model, profiles)
    index = state.profile_index
    if index >= len(primary.fallback):
        return None
    return resolve_profile(primary.fallback[index], profiles)


def fail_over(
    rt: Runtime,
    run: Run,
    owner: str,
    spec: AgentSpec,
    state: LoopState,
    error: str,
    billed: Sequence[Mapping[str, Any]] = (),
) -> None:
    """Move the run's next round to the next profile of the chain, now (``billed``: the
    calls the failed attempt made that the provider bills)."""
    failed = serving(spec, state, rt.profiles, run_store.now())[0]
    target = next_profile(spec, state, rt.profiles)
    assert target is not None
    moved = replace(state, profile_index=state.profile_index + 1, failover_at=run_store.now())
    change = Change.by_holder(run, owner)
    change.bill(billed)
    change.values.update(
        loop=moved.to_dict(), status=Status.RUNNING.value, lease_owner=None, wake_at=None
    )
    change.queue_round = True
    change.event(
        EventType.MODEL_FAILOVER,
        round=state.round + 1,
        failed=failed.name,
        serving=target.name,
        error=error[:500],
    )
    attempt(rt, lambda tx: tx.apply(change))
