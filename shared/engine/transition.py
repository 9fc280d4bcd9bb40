"""Every state change of a run passes through this module: the transaction every command,
round and tool task opens, and the one ordered list of what a change entails.

A transition is one database transaction (``shared.engine.tx.Tx``) in which one or more
``Change``s (``shared.engine.change``) are applied, each to one run, under the lock order and
the version guard ``Tx`` documents. What a change entails is applied in the same transaction,
in this order (``FOLLOW_UPS``):

1. ``posted``: messages posted to the run while it worked or waited join its next request;
2. ``children``: a child run that ends, pauses or resumes tells its parent (the join, or its
   surfaced pause);
3. ``threads``: a run that ends on a thread starts the thread's next held run;
4. ``admission``: a top-level run that ends or pauses lets its tenant's next waiting run in;
5. ``suspension``: a run asked to suspend whose round a change queued parks instead.

After the commit (never before, never on rollback) the dispatches are published — the broker
is only a doorbell, a lost one is re-sent by the reaper from the state itself —, the runs' SSE
tails are woken, and the runs that paused or ended leave this process's caches. There is no
outbox row for rounds and tool calls: the state says what is due (a runnable run with no live
lease and no open calls is due for a round; a ``queued`` call is due for its tool task).

The join — a tool call's or a child run's end — is ``shared.engine.join.finish_call``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Final, TypeVar

from shared.engine import admission, children, posted, suspension, threads
from shared.engine.change import LostRace
from shared.engine.runtime import Runtime
from shared.engine.tx import FollowUp, Tx
from shared.errors import Conflict
from shared.store import runs as run_store

__all__ = ["FOLLOW_UPS", "attempt", "retrying", "transaction"]

T = TypeVar("T")

FOLLOW_UPS: Final[tuple[FollowUp, ...]] = (
    posted.follow_up,
    children.follow_up,
    threads.follow_up,
    admission.follow_up,
    suspension.follow_up,
)


@contextmanager
def transaction(rt: Runtime) -> Iterator[Tx]:
    """A transition's transaction; publishes and wakes after a successful commit."""
    with rt.engine.begin() as conn:
        tx = Tx(rt, conn, run_store.now(), FOLLOW_UPS)
        yield tx
    tx.after_commit()


def attempt(rt: Runtime, op: Callable[[Tx], T]) -> T | None:
    """``op`` in one transaction; None when it lost a race (rolled back)."""
    try:
        with transaction(rt) as tx:
            return op(tx)
    except LostRace:
        return None


def retrying(rt: Runtime, op: Callable[[Tx], T], tries: int = 20) -> T:
    """``op`` in a transaction, read again and retried while it loses races (the API's
    commands: a person's answer must not fail because a tool finished at the same time)."""
    for _ in range(tries):
        try:
            with transaction(rt) as tx:
                return op(tx)
        except LostRace:
            continue
    raise Conflict("the run kept changing; try again")
