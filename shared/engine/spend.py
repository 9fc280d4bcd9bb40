"""Reservations, so no cap overshoots (docs/cost.md).

Before a model call the round reserves the call's worst case (``shared.agent.spend``) on the
run (against its ``budget.max_cost``) and in every spend envelope it counts against (its
tenant's, its named agent's, its cron's), in one transaction of guarded UPDATEs; after the call
it settles: the reservation is released and the real cost spent. A call that cannot be
afforded is not sent: a run's own cap first lowers the call's ``max_tokens`` to what is left,
then ends the run (``budget_cost``); a full envelope makes the run wait for the next period or
a raised cap (``pending.kind: budget``), or fail at once (``on_exceed: fail``).

A worker killed between the two leaves the reservation on the run's row (``runs.reserved``):
whoever takes the round over, or cancels the run, settles it as spent — the most the call
could have cost.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

from sqlalchemy.engine import Connection

from shared.agent.spec import AgentSpec, ModelProfile
from shared.agent.spend import affordable_max_tokens, input_bound, worst_case
from shared.agent.tokens import estimate_messages_tokens, estimate_tokens
from shared.engine.change import Change
from shared.engine.runtime import Runtime
from shared.engine.transition import attempt, retrying
from shared.engine.tx import Tx
from shared.llm.base import ModelRequest
from shared.store import runs as run_store
from shared.store import spend as store
from shared.store.rows import Run, Status
from shared.vocab import EventType

__all__ = [
    "BUDGET",
    "ENVELOPE_FULL",
    "MIN_OUTPUT_TOKENS",
    "EnvelopeFull",
    "OverBudget",
    "Held",
    "Reservation",
    "held_for",
    "keys_of",
    "request_size",
    "reserve",
    "settle",
    "settle_left",
    "wait_for",
    "wake",
]

BUDGET = "budget"  # pending.kind of a run waiting for a spend envelope
ENVELOPE_FULL = "budget_envelope"  # the stop reason of a run an envelope failed
MIN_OUTPUT_TOKENS = 16
"""A call whose budget leaves it fewer output tokens than this is not made."""


class OverBudget(Exception):  # noqa: N818 - control flow
    """The run's own ``max_cost`` cannot afford the call."""


class EnvelopeFull(Exception):  # noqa: N818 - control flow
    """A spend envelope the run counts against is full for this period (``never``: the call
    costs more than the envelope's whole cap, no period will afford it)."""

    def __init__(self, envelope: store.Envelope, amount: float) -> None:
        self.envelope, self.never = envelope, amount > envelope.cap
        what = f"spend envelope {envelope.scope}:{envelope.key or '-'}"
        if self.never:
            text = f"a call may cost {amount:.6f}, more than {what}'s cap {envelope.cap}"
        else:
            text = f"{what} is full: {envelope.spent:.6f} of {envelope.cap} spent"
        super().__init__(text)


@dataclass(frozen=True, slots=True)
class Reservation:
    """What a call reserved: on its run, and in these envelopes of its tenant."""

    run_id: str
    tenant: str
    keys: tuple[store.Key, ...]
    amount: float
    max_tokens: int  # the call's max_tokens (lowered to what its run's budget affords)


def keys_of(run: Run) -> tuple[store.Key, ...]:
    """The envelopes a run counts against: its tenant's, then its agent's and cron's."""
    extra = [tuple(k.split(":", 1)) for k in run.spend_keys or () if ":" in k]
    return (("tenant", ""), *((s, k) for s, k in extra))


IMAGE_TOKENS = 2_000  # an image part: more than a provider counts for one at full detail


def request_size(request: ModelRequest) -> tuple[int, int]:
    """A request's estimated tokens (its messages, tool calls and tool schemas; an image
    part counts ``IMAGE_TOKENS``) and its number of messages."""
    size = estimate_messages_tokens(request.messages)
    for m in request.messages:
        if isinstance(m.content, list):
            size += IMAGE_TOKENS * sum(1 for p in m.content if p.get("type") != "text")
    for t in request.tools:
        size += estimate_tokens(f"{t.name} {t.description} {json.dumps(t.parameters)}")
    return size, len(request.messages)


def reserve(
    rt: Runtime,
    run: Run,
    spec: AgentSpec,
    profile: ModelProfile,
    request: ModelRequest,
) -> Reservation | None:
    """Reserve the call's worst case; None when nothing caps the run (no reservation).
    Raises ``OverBudget`` or ``EnvelopeFull``."""
    cap = spec.budget.max_cost
    enveloped = rt.envelopes.any(rt.engine, run.tenant)
    if (cap is None and not enveloped) or profile.own_key:
        return None
    size, count = request_size(request)
    tokens = input_bound(size, count)
    max_tokens = request.max_tokens or profile.max_tokens
    if cap is not None:
        left = cap - run.cost - run.reserved
        max_tokens = affordable_max_tokens(profile.pricing, tokens, max_tokens, left, False)
        if max_tokens < MIN_OUTPUT_TOKENS:
            raise OverBudget(f"the run's max_cost {cap} leaves {max(left, 0):.6f}")
    amount = worst_case(profile.pricing, tokens, max_tokens, False)
    keys = keys_of(run) if enveloped else ()
    with rt.engine.begin() as conn:
        if not store.reserve_run(conn, run.id, amount, cap):
            raise OverBudget(f"the run's max_cost {cap} is reserved by its calls in flight")
        if keys:
            store.roll(conn, run.tenant, run_store.now(), rt.settings.timezone)
            refused = store.reserve(conn, run.tenant, keys, amount)
            if refused is not None:
                raise EnvelopeFull(refused, amount)  # the others' reservations roll back
    return Reservation(run.id, run.tenant, keys, amount, max_tokens)


def settle(rt: Runtime, reservation: Reservation | None, cost: float) -> None:
    """The call ended (answered, failed, cut short): release its reservation, spend ``cost``."""
    if reservation is None:
        return
    with rt.engine.begin() as conn:
        _settle(
            conn, reservation.run_id, reservation.tenant, reservation.keys, reservation.amount, cost
        )


def settle_left(conn: Connection, run: Run) -> None:
    """A reservation a killed worker left on ``run`` (its round taken over, or the run
    cancelled): spent in full, the most its call could have cost."""
    if run.reserved > 0:
        _settle(conn, run.id, run.tenant, keys_of(run), run.reserved, run.reserved)


def _settle(
    conn: Connection,
    run_id: str,
    tenant: str,
    keys: Sequence[store.Key],
    amount: float,
    cost: float,
) -> None:
    store.release_run(conn, run_id, amount)
    if keys:
        store.settle(conn, tenant, keys, amount, cost, run_store.now())


@dataclass
class Held:
    """A call's reservation while it runs: the request to send (its ``max_tokens`` maybe
    lowered to what the run's budget affords) and, once known, what the call cost."""

    reservation: Reservation | None
    request: ModelRequest
    cost: float | None = None  # None when it ends: the worst case (it may have been billed)


@contextmanager
def held_for(
    rt: Runtime, run: Run, spec: AgentSpec, profile: ModelProfile, request: ModelRequest
) -> Iterator[Held]:
    """Reserve the call's worst case for the block, and settle when it ends: to ``cost``, as
    the block set it, else to the worst case. Raises ``OverBudget`` or ``EnvelopeFull``
    before the block runs."""
    reservation = reserve(rt, run, spec, profile, request)
    if reservation is not None and reservation.max_tokens != request.max_tokens:
        request = replace(request, max_tokens=reservation.max_tokens)
    held = Held(reservation, request)
    try:
        yield held
    finally:
        worst = reservation.amount if reservation is not None else 0.0
        settle(rt, reservation, held.cost if held.cost is not None else worst)


def wait_for(rt: Runtime, run: Run, owner: str, envelope: store.Envelope) -> None:
    """The run waits, holding nothing, until the envelope's period turns (its ``wake_at``) or
    its cap is raised (``wake``); the reaper then gives it its round again."""
    pending = {
        "kind": BUDGET,
        "scope": envelope.scope,
        "key": envelope.key,
        "cap": envelope.cap,
        "spent": envelope.spent,
        "reserved": envelope.reserved,
        "period_ends_at": envelope.period_end,
        "since_at": run_store.now(),
    }
    change = Change.by_holder(run, owner)
    change.values.update(
        status=Status.WAITING.value, pending=pending, wake_at=envelope.period_end, lease_owner=None
    )
    change.event(EventType.RUN_WAITING, pending=pending)
    attempt(rt, lambda tx: tx.apply(change))


def wake(rt: Runtime, run_id: str) -> bool:
    """A run waiting for an envelope is due again (its period turned, or a cap was raised):
    its round is queued; if the envelope is still full the round puts it back to waiting."""

    def op(tx: Tx) -> bool:
        run = run_store.load_run(tx.conn, run_id)
        if run is None or run.status != Status.WAITING:
            return False
        if (run.pending or {}).get("kind") != BUDGET:
            return False
        change = Change(run, queue_round=True)
        change.values.update(status=Status.RUNNING.value, pending=None, wake_at=None)
        change.event(EventType.RUN_RESUMED, after=BUDGET)
        tx.apply(change)
        return True

    return bool(retrying(rt, op))
