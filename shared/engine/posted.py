"""Messages posted to a run (steer: ``POST /v1/runs/{id}/messages``) wait in ``runs.steer``
until a transition queues the run's next round; that transition's follow-up appends them,
after the change's own messages (the batch's tool messages, an answer), so the next model
request has them. The guarded UPDATE that read ``steer`` holds the row: a poster waits."""

from __future__ import annotations

from collections.abc import Sequence

from shared.agent.messages import Message
from shared.engine.change import Change
from shared.engine.tx import Applied, Tx

__all__ = ["follow_up"]


def follow_up(tx: Tx, applied: Applied) -> Sequence[Change]:
    change, run = applied.change, applied.after
    if not change.queue_round or not run.steer or "steer" in change.values:
        return ()
    round_ = int(change.values.get("round", change.run.round))
    posted = Change(run, bump=False, values={"steer": None})
    for p in run.steer:
        posted.message(Message(role="user", content=p["content"]), round_)
    return (posted,)
