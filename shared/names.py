"""Every name the processes agree on, defined once: Celery task names, queue names, which
queue each task goes to, and which task a dispatch's ``kind`` sends.

The API, the CLI and embedded mode send tasks *by name* (``send_task``) and never import the
task functions (``worker.tasks``); the worker registers its functions under these names.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "ALL_QUEUES",
    "PRIORITY_HEADER",
    "SENT_HEADER",
    "DISPATCH_TASKS",
    "REAPER_QUEUE",
    "REAP_TASK",
    "ROUNDS_QUEUE",
    "ROUND_TASK",
    "TASK_QUEUES",
    "TOOLS_QUEUE",
    "TOOL_TASK",
    "WEBHOOKS_QUEUE",
    "WEBHOOK_TASK",
]

ROUND_TASK: Final = "treadle.round"  # one model round of a run
TOOL_TASK: Final = "treadle.tool"  # one external tool call
WEBHOOK_TASK: Final = "treadle.webhook"  # one try of one webhook delivery
REAP_TASK: Final = "treadle.reap"  # the reaper pass (Celery beat)

ROUNDS_QUEUE: Final = "treadle.rounds"
TOOLS_QUEUE: Final = "treadle.tools"
WEBHOOKS_QUEUE: Final = "treadle.webhooks"  # a slow receiver never delays a round
REAPER_QUEUE: Final = "treadle.reaper"  # the reaper never waits behind a backlog of rounds
ALL_QUEUES: Final = (ROUNDS_QUEUE, TOOLS_QUEUE, WEBHOOKS_QUEUE, REAPER_QUEUE)

TASK_QUEUES: Final = {
    ROUND_TASK: ROUNDS_QUEUE,
    TOOL_TASK: TOOLS_QUEUE,
    REAP_TASK: REAPER_QUEUE,
    WEBHOOK_TASK: WEBHOOKS_QUEUE,
}
DISPATCH_TASKS: Final = {"round": ROUND_TASK, "tool": TOOL_TASK, "webhook": WEBHOOK_TASK}

# message headers of a dispatch: when it was published (epoch seconds, the publisher's clock)
# and its run's priority; a worker notes the newest it took per queue and priority, and the
# reaper knows from that which unclaimed dispatch its queue no longer holds (shared.engine.reaper)
SENT_HEADER: Final = "treadle_sent"
PRIORITY_HEADER: Final = "treadle_priority"
