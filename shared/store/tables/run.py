"""A run's tables: its hot row and what it was given, what it appends (messages, usage,
events, tool calls), its outbox and webhooks, its thread and its facade segments, and the
workers whose heartbeats make its leases live."""

from __future__ import annotations

import sqlalchemy as sa

from shared.store.tables.meta import metadata

__all__ = [
    "events",
    "facade_segments",
    "messages",
    "outbox",
    "resume_tokens",
    "run_specs",
    "runs",
    "threads",
    "tool_calls",
    "usage",
    "webhook_attempts",
    "webhook_deliveries",
    "workers",
]

runs = sa.Table(
    # the hot row: what a transition reads and writes, small so that updates are cheap (and
    # HOT-eligible on PostgreSQL); the large immutable parts of a run are in ``run_specs``
    "runs",
    metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("tenant", sa.String(64), nullable=False, server_default="default"),
    sa.Column("parent_run_id", sa.String(40), nullable=True),
    sa.Column("parent_call_id", sa.String(128), nullable=True),
    sa.Column("thread_id", sa.String(64), nullable=True),
    sa.Column("kind", sa.String(20), nullable=False),
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
    # the worker process (``workers.id``) that holds the run's round; the lease is live while
    # that worker's heartbeat is fresh
    sa.Column("lease_owner", sa.String(64), nullable=True),
    sa.Column("deadline_at", sa.Float, nullable=True),
    # when the reaper looks at the run next: a waiting run's ask expiry, a round's retry time
    sa.Column("wake_at", sa.Float, nullable=True),
    sa.Column("redrives", sa.Integer, nullable=False, server_default="0"),
    # when its round's dispatch was last sent (the reaper re-sends one its queue has lost)
    sa.Column("dispatched_at", sa.Float, nullable=True),
    # claims of its current round so far (the claim counts, the round's commit resets): a
    # round that keeps failing ends the run at its agent's ``max_attempts``
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("last_error", sa.JSON, nullable=True),  # why the round's last attempt failed
    # the worst case of its model calls in flight, reserved against its budget and envelopes
    sa.Column("reserved", sa.Float, nullable=False, server_default="0"),
    # the spend envelopes it counts against besides its tenant's: ["agent:<name>", "cron:<id>"]
    sa.Column("spend_keys", sa.JSON, nullable=True),
    sa.Column("idempotency_key", sa.String(200), nullable=True),
    sa.Column("msg_seq", sa.Integer, nullable=False, server_default="0"),
    sa.Column("event_seq", sa.Integer, nullable=False, server_default="0"),
    sa.Column("view_start", sa.Integer, nullable=False, server_default="0"),
    sa.Column("view_tokens", sa.Integer, nullable=False, server_default="0"),
    sa.Column("webhook", sa.JSON, nullable=True),
    # a queued run on a busy thread (multitask enqueue): not dispatched until its thread's
    # active run ends; stays true on a run cancelled before it started
    sa.Column("held", sa.Boolean, nullable=False, server_default=sa.false()),
    # lineage (shared.store.lineage): the run's transcript starts with ``base_run_id``'s
    # messages up to ``base_seq`` (read by reference, never copied), as they are (``fork``) or
    # as a thread's history (``thread``); the run's own messages are numbered after it
    sa.Column("base_run_id", sa.String(40), nullable=True),
    sa.Column("base_seq", sa.Integer, nullable=False, server_default="0"),
    sa.Column("base_kind", sa.String(8), nullable=True),  # fork | thread
    sa.Column("fork_round", sa.Integer, nullable=True),  # a fork: the base's round it took
    # the spec's revision: a resume that overrides the spec bumps it (caches key on it)
    sa.Column("spec_rev", sa.Integer, nullable=False, server_default="0"),
    # user messages posted to the run, waiting for the transition that queues its next round
    sa.Column("steer", sa.JSON, nullable=True),
    # the broker message priority of its rounds and tools, 0-9 (9 first)
    sa.Column("priority", sa.Integer, nullable=False, server_default="5"),
    # retention: an ended run is purged this many seconds after its last change
    sa.Column("ttl_s", sa.Float, nullable=True),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
    # when it last ended (None while it has not): the search's ``ended_after``/``ended_before``
    sa.Column("ended_at", sa.Float, nullable=True),
    # a suspend asked while its round or tools were in flight: its next round boundary parks it
    sa.Column("suspend_at", sa.Float, nullable=True),
    sa.UniqueConstraint("tenant", "idempotency_key", name="uq_runs_idempotency"),
)
sa.Index("ix_runs_status", runs.c.status)
sa.Index("ix_runs_tenant_created", runs.c.tenant, runs.c.created_at)
sa.Index("ix_runs_thread", runs.c.thread_id)
sa.Index("ix_runs_wake", runs.c.wake_at)
sa.Index("ix_runs_lease_owner", runs.c.lease_owner)
sa.Index("ix_runs_base", runs.c.base_run_id)
sa.Index("ix_runs_tenant_ended", runs.c.tenant, runs.c.ended_at)
sa.Index("ix_runs_tenant_status", runs.c.tenant, runs.c.status)  # admission counts
sa.Index("ix_runs_status_updated", runs.c.status, runs.c.updated_at)  # retention
sa.Index("ix_runs_ttl", runs.c.ttl_s)  # retention: runs with their own ttl_s
sa.Index("ix_runs_parent", runs.c.parent_run_id)  # a run's children (sub-agents)

run_specs = sa.Table(
    # what a run was given, written once: its agent spec, inputs (quotes, attachments) and the
    # client's metadata
    "run_specs",
    metadata,
    sa.Column("run_id", sa.String(40), primary_key=True),
    sa.Column("agent", sa.JSON, nullable=False),
    sa.Column("inputs", sa.JSON, nullable=True),
    sa.Column("meta", sa.JSON, nullable=True),
    sa.Column("warnings", sa.JSON, nullable=True),  # P-5: what the catalog dropped, and why
    sa.Column("agent_ref", sa.String(140), nullable=True),  # "name" or "name@version" it ran
    sa.Column("trace", sa.JSON, nullable=True),  # the run's trace context (W3C traceparent)
)

workers = sa.Table(
    # one row per worker process: its heartbeat makes the leases it holds live
    "workers",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("host", sa.String(255), nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("started_at", sa.Float, nullable=False),
    sa.Column("seen_at", sa.Float, nullable=False),
    # what it has taken from its queues: per "queue/priority", the send time of the newest
    # dispatch it received (the reaper's proof that an older unclaimed one was lost)
    sa.Column("received", sa.JSON, nullable=True),
)

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
    sa.Column("tokens", sa.Integer, nullable=False, server_default="0"),  # estimated, once
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
    sa.Column("lease_owner", sa.String(64), nullable=True),  # a ``workers.id`` (see runs)
    sa.Column("flushed", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("queued_at", sa.Float, nullable=True),  # dispatched (the reaper re-sends after)
    sa.Column("redrives", sa.Integer, nullable=False, server_default="0"),
    sa.Column("started_at", sa.Float, nullable=True),
    sa.Column("finished_at", sa.Float, nullable=True),
)
sa.Index("ix_tool_calls_open", tool_calls.c.status, tool_calls.c.queued_at)

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
    sa.Column("reasoning_tokens", sa.Integer, nullable=False, server_default="0"),
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
    sa.Column("kind", sa.String(16), nullable=False),  # webhook (rounds and tools: see runs)
    sa.Column("payload", sa.JSON, nullable=False),
    sa.Column("available_at", sa.Float, nullable=False, index=True),
    sa.Column("created_at", sa.Float, nullable=False),
)

# --- webhooks: one delivery per (run, event); one attempt row per HTTP try -----------------
webhook_deliveries = sa.Table(
    "webhook_deliveries",
    metadata,
    sa.Column("id", sa.String(40), primary_key=True),  # the webhook-id header (msg_...)
    sa.Column("run_id", sa.String(40), nullable=False),
    sa.Column("tenant", sa.String(64), nullable=False),
    sa.Column("event_seq", sa.Integer, nullable=False),
    sa.Column("event_type", sa.String(32), nullable=False),
    sa.Column("url", sa.Text, nullable=False),
    sa.Column("secret_env", sa.String(128), nullable=True),  # the env var name, never the secret
    sa.Column("body", sa.Text, nullable=False),  # the exact JSON that is signed and sent
    # pending | sending | delivered | failed
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("next_attempt_at", sa.Float, nullable=True),
    sa.Column("lease_until", sa.Float, nullable=True),
    sa.Column("last_status_code", sa.Integer, nullable=True),
    sa.Column("last_error", sa.Text, nullable=True),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
    sa.Column("delivered_at", sa.Float, nullable=True),
    sa.UniqueConstraint("run_id", "event_seq", name="uq_webhook_deliveries_event"),
)

webhook_attempts = sa.Table(
    "webhook_attempts",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("delivery_id", sa.String(40), nullable=False, index=True),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("started_at", sa.Float, nullable=False),
    sa.Column("duration_ms", sa.Integer, nullable=False),
    sa.Column("status_code", sa.Integer, nullable=True),
    sa.Column("error", sa.Text, nullable=True),
    sa.Column("response", sa.Text, nullable=True),  # the first 500 characters
)

# a per-pause credential for /answer or /approval, delivered only in the run.waiting webhook
resume_tokens = sa.Table(
    "resume_tokens",
    metadata,
    sa.Column("token_hash", sa.String(64), primary_key=True),  # sha256 hex of the token
    sa.Column("run_id", sa.String(40), nullable=False, index=True),
    sa.Column("kind", sa.String(16), nullable=False),  # ask | approval
    sa.Column("pause_id", sa.String(200), nullable=False),  # the ask_id or approval_id
    sa.Column("expires_at", sa.Float, nullable=True),
    sa.Column("used_at", sa.Float, nullable=True),
    sa.Column("created_at", sa.Float, nullable=False),
)

threads = sa.Table(
    "threads",
    metadata,
    # a server-made UUID, or a LangGraph client's name scoped to its tenant (``<name>~<digest>``)
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("tenant", sa.String(64), nullable=False, server_default="default"),
    sa.Column("meta", sa.JSON, nullable=True),  # the client's metadata
    # what a new run on a busy thread does: reject | enqueue | interrupt
    sa.Column("multitask", sa.String(16), nullable=False, server_default="enqueue"),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
)
sa.Index("ix_threads_tenant_created", threads.c.tenant, threads.c.created_at)

# --- interop facades: each LangGraph run / OpenAI response is a segment of a
# treadle run: from its start or a resume (``from_seq``, the seq of the run.waiting it resumes,
# 0 for the start) to the next pause or the end (``to_seq``, filled once seen) ---------------
facade_segments = sa.Table(
    "facade_segments",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),  # deterministic: (protocol, run, from_seq)
    sa.Column("protocol", sa.String(16), nullable=False),  # langgraph | openai
    sa.Column("tenant", sa.String(64), nullable=False, server_default="default"),
    sa.Column("thread_id", sa.String(64), nullable=True),
    sa.Column("run_id", sa.String(40), nullable=False),
    sa.Column("from_seq", sa.Integer, nullable=False),
    sa.Column("to_seq", sa.Integer, nullable=True),
    sa.Column("assistant_id", sa.String(200), nullable=False),  # agent name (OpenAI: model)
    sa.Column("meta", sa.JSON, nullable=True),  # the client's metadata
    sa.Column("options", sa.JSON, nullable=True),  # stream modes, multitask, input items, ...
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
    sa.UniqueConstraint("protocol", "run_id", "from_seq", name="uq_facade_segments_leg"),
)
sa.Index("ix_facade_segments_thread", facade_segments.c.thread_id, facade_segments.c.created_at)
sa.Index("ix_facade_segments_run", facade_segments.c.run_id)
