"""The schema, SQLAlchemy Core (tables: docs/durability.md). Times are epoch seconds (floats)
on every dialect.

Append-only where it grows: a round inserts its new ``messages``, ``usage``, ``events`` and
``tool_calls`` rows and updates one ``runs`` row, so the bytes written per round do not grow
with the length of the run.

One ``metadata`` (``meta``); a run's tables are in ``run``, a tenant's other resources in
``tenant``. Import them from here.
"""

from __future__ import annotations

from shared.store.tables.meta import metadata
from shared.store.tables.run import (
    events,
    facade_segments,
    messages,
    outbox,
    resume_tokens,
    run_specs,
    runs,
    threads,
    tool_calls,
    usage,
    webhook_attempts,
    webhook_deliveries,
    workers,
)
from shared.store.tables.tenant import (
    agent_tags,
    agent_versions,
    api_keys,
    cron_fires,
    crons,
    dataset_chunks,
    dataset_documents,
    datasets,
    files,
    memory_items,
    spend_envelopes,
    tenants,
)

__all__ = [
    "agent_tags",
    "agent_versions",
    "api_keys",
    "cron_fires",
    "crons",
    "dataset_chunks",
    "dataset_documents",
    "datasets",
    "events",
    "facade_segments",
    "files",
    "metadata",
    "memory_items",
    "messages",
    "outbox",
    "runs",
    "resume_tokens",
    "spend_envelopes",
    "run_specs",
    "tenants",
    "threads",
    "tool_calls",
    "usage",
    "webhook_attempts",
    "webhook_deliveries",
    "workers",
]
