"""The schema (DESIGN §5), SQLAlchemy Core. Times are epoch seconds (floats) on every dialect.

Append-only where it grows: a round inserts its new ``messages``, ``usage``, ``events`` and
``tool_calls`` rows and updates one ``runs`` row, so the bytes written per round do not grow
with the length of the run.
"""

from __future__ import annotations

import sqlalchemy as sa

__all__ = [
    "events",
    "metadata",
    "messages",
    "outbox",
    "runs",
    "tool_calls",
    "usage",
]

metadata = sa.MetaData()

runs = sa.Table(
    "runs",
    metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("tenant", sa.String(64), nullable=False, server_default="default"),
    sa.Column("parent_run_id", sa.String(40), nullable=True),
    sa.Column("parent_call_id", sa.String(128), nullable=True),
    sa.Column("thread_id", sa.String(40), nullable=True),
    sa.Column("kind", sa.String(20), nullable=False),
    sa.Column("agent", sa.JSON, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("stop_reason", sa.String(32), nullable=True),
    sa.Column("version", sa.Integer, nullable=False, server_default="0"),
    sa.Column("round", sa.Integer, nullable=False, server_default="0"),
    sa.Column("open_calls", sa.Integer, nullable=False, server_default="0"),
    sa.Column("plan", sa.JSON, nullable=True),
    sa.Column("pending", sa.JSON, nullable=True),
    sa.Column("after_join", sa.JSON, nullable=True),
    sa.Column("loop", sa.JSON, nullable=True),
    sa.Column("input_tokens", sa.Integer, nullable=False, server_default="0"),
    sa.Column("output_tokens", sa.Integer, nullable=False, server_default="0"),
    sa.Column("cost", sa.Float, nullable=False, server_default="0"),
    sa.Column("result", sa.JSON, nullable=True),
    sa.Column("error", sa.JSON, nullable=True),
    sa.Column("lease_owner", sa.String(64), nullable=True),
    sa.Column("lease_until", sa.Float, nullable=True),
    sa.Column("deadline_at", sa.Float, nullable=True),
    sa.Column("wake_at", sa.Float, nullable=True),  # a waiting run's ask expiry (reaper)
    sa.Column("idempotency_key", sa.String(200), nullable=True),
    sa.Column("msg_seq", sa.Integer, nullable=False, server_default="0"),
    sa.Column("event_seq", sa.Integer, nullable=False, server_default="0"),
    sa.Column("view_start", sa.Integer, nullable=False, server_default="0"),
    sa.Column("inputs", sa.JSON, nullable=True),  # quotes, attachments: what the run was given
    sa.Column("meta", sa.JSON, nullable=True),
    sa.Column("webhook", sa.JSON, nullable=True),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
    sa.UniqueConstraint("tenant", "idempotency_key", name="uq_runs_idempotency"),
)
sa.Index("ix_runs_status", runs.c.status)
sa.Index("ix_runs_tenant_created", runs.c.tenant, runs.c.created_at)
sa.Index("ix_runs_thread", runs.c.thread_id)
sa.Index("ix_runs_wake", runs.c.wake_at)

messages = sa.Table(
    "messages",
    metadata,
    sa.Column("run_id", sa.String(40), primary_key=True),
    sa.Column("seq", sa.Integer, primary_key=True),
    sa.Column("round", sa.Integer, nullable=False, server_default="0"),
    sa.Column("role", sa.String(16), nullable=False),
    sa.Column("content", sa.JSON, nullable=True),
    sa.Column("reasoning", sa.Text, nullable=True),
    sa.Column("tool_calls", sa.JSON, nullable=True),
    sa.Column("tool_call_id", sa.String(128), nullable=True),
    sa.Column("name", sa.String(128), nullable=True),
    sa.Column("hidden", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("kind", sa.String(32), nullable=True),
    sa.Column("created_at", sa.Float, nullable=False),
)

tool_calls = sa.Table(
    "tool_calls",
    metadata,
    sa.Column("run_id", sa.String(40), primary_key=True),
    sa.Column("call_id", sa.String(128), primary_key=True),
    sa.Column("round", sa.Integer, nullable=False),
    sa.Column("idx", sa.Integer, nullable=False),
    sa.Column("name", sa.String(128), nullable=False),
    sa.Column("arguments", sa.Text, nullable=False),
    sa.Column("read_only", sa.Boolean, nullable=False),
    # pending (not dispatched) | queued | running | done | waiting (a person must act)
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("result", sa.Text, nullable=True),
    sa.Column("result_for_model", sa.Text, nullable=True),
    sa.Column("error", sa.Text, nullable=True),
    sa.Column("cost", sa.Float, nullable=False, server_default="0"),
    sa.Column("data", sa.JSON, nullable=True),
    sa.Column("lease_until", sa.Float, nullable=True),
    sa.Column("flushed", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("started_at", sa.Float, nullable=True),
    sa.Column("finished_at", sa.Float, nullable=True),
)

usage = sa.Table(
    "usage",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("run_id", sa.String(40), nullable=False, index=True),
    sa.Column("round", sa.Integer, nullable=False),
    sa.Column("purpose", sa.String(16), nullable=False, server_default="round"),
    sa.Column("profile", sa.String(64), nullable=True),
    sa.Column("model", sa.String(128), nullable=True),
    sa.Column("input_tokens", sa.Integer, nullable=False, server_default="0"),
    sa.Column("output_tokens", sa.Integer, nullable=False, server_default="0"),
    sa.Column("cached_input_tokens", sa.Integer, nullable=False, server_default="0"),
    sa.Column("cost", sa.Float, nullable=False, server_default="0"),
    sa.Column("estimated", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("committed", sa.Boolean, nullable=False, server_default=sa.true()),
    sa.Column("latency_ms", sa.Integer, nullable=True),
    sa.Column("created_at", sa.Float, nullable=False),
)

events = sa.Table(
    "events",
    metadata,
    sa.Column("run_id", sa.String(40), primary_key=True),
    sa.Column("seq", sa.Integer, primary_key=True),
    sa.Column("type", sa.String(32), nullable=False),
    sa.Column("data", sa.JSON, nullable=True),
    sa.Column("created_at", sa.Float, nullable=False),
)

outbox = sa.Table(
    "outbox",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("run_id", sa.String(40), nullable=False, index=True),
    sa.Column("kind", sa.String(16), nullable=False),  # round | tool
    sa.Column("payload", sa.JSON, nullable=False),
    sa.Column("available_at", sa.Float, nullable=False, index=True),
    sa.Column("created_at", sa.Float, nullable=False),
)
