"""A tenant's own resources, beside its runs: its agents and their tags, API keys, files,
datasets, crons, memory items and spend envelopes."""

from __future__ import annotations

import sqlalchemy as sa

from shared.store.tables.meta import metadata

__all__ = [
    "agent_tags",
    "agent_versions",
    "api_keys",
    "cron_fires",
    "crons",
    "dataset_chunks",
    "dataset_documents",
    "datasets",
    "files",
    "memory_items",
    "spend_envelopes",
    "tenants",
]

agent_versions = sa.Table(
    # agents created over the API, per tenant: every version immutable, the latest is the
    # highest (the file-registered agents are not here)
    "agent_versions",
    metadata,
    sa.Column("tenant", sa.String(64), primary_key=True),
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("version", sa.Integer, primary_key=True),
    sa.Column("spec", sa.JSON, nullable=False),
    sa.Column("description", sa.Text, nullable=True),
    sa.Column("meta", sa.JSON, nullable=True),  # the client's metadata
    sa.Column("facade", sa.JSON, nullable=True),  # how a facade made it (LangGraph graph_id...)
    sa.Column("created_at", sa.Float, nullable=False),
)

agent_tags = sa.Table(
    # a name's tags (``prod``, ``staging``): each points at one of its versions; ``name@tag``
    # resolves through it, and moving it is a rollback
    "agent_tags",
    metadata,
    sa.Column("tenant", sa.String(64), primary_key=True),
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("tag", sa.String(32), primary_key=True),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
)

# --- attachments: uploaded files; bytes in ``data`` (database storage) or in a
# directory (``TREADLE_FILES_DIR``) at ``location``, relative to it --------------------------
files = sa.Table(
    "files",
    metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("tenant", sa.String(64), nullable=False, server_default="default"),
    sa.Column("name", sa.String(255), nullable=False),
    sa.Column("size", sa.BigInteger, nullable=False),
    sa.Column("sha256", sa.String(64), nullable=False),
    sa.Column("content_type", sa.String(100), nullable=False),
    sa.Column("data", sa.LargeBinary, nullable=True),
    sa.Column("location", sa.Text, nullable=True),
    sa.Column("created_at", sa.Float, nullable=False),
)
sa.Index("ix_files_tenant_created", files.c.tenant, files.c.created_at)

# --- security: tenants and their API keys (only the key's SHA-256 is stored) ----------------
tenants = sa.Table(
    "tenants",
    metadata,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("created_at", sa.Float, nullable=False),
)

api_keys = sa.Table(
    "api_keys",
    metadata,
    sa.Column("id", sa.String(40), primary_key=True),  # key_...: what list and revoke name
    sa.Column("tenant", sa.String(64), nullable=False),
    sa.Column("key_hash", sa.String(64), nullable=False, unique=True),  # sha256 hex
    sa.Column("prefix", sa.String(16), nullable=False),  # the key's first characters, for people
    sa.Column("name", sa.String(200), nullable=True),
    sa.Column("scopes", sa.JSON, nullable=False),  # ["runs:write", "runs:read", "admin"]
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("revoked_at", sa.Float, nullable=True),
)
sa.Index("ix_api_keys_tenant", api_keys.c.tenant)

# --- knowledge base: datasets of documents cut into chunks. The full-text index
# is per dialect, made by migration 0006: SQLite an FTS5 table ``dataset_chunks_fts`` over
# ``search_text``; PostgreSQL a generated ``tsv`` tsvector column with a GIN index. Neither is
# declared here (Core queries name them in SQL). ``embedding``: a JSON vector when an
# embeddings profile is configured (hybrid ranking) ------------------------------------------
datasets = sa.Table(
    "datasets",
    metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("tenant", sa.String(64), nullable=False, server_default="default"),
    sa.Column("name", sa.String(200), nullable=False),
    sa.Column("description", sa.Text, nullable=True),
    sa.Column("embedding_model", sa.String(200), nullable=True),  # what embedded its chunks
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
    sa.UniqueConstraint("tenant", "name", name="uq_datasets_tenant_name"),
)

dataset_documents = sa.Table(
    "dataset_documents",
    metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("dataset_id", sa.String(40), nullable=False),
    sa.Column("tenant", sa.String(64), nullable=False, server_default="default"),
    sa.Column("name", sa.String(255), nullable=False),
    sa.Column("content_type", sa.String(100), nullable=False),
    sa.Column("size", sa.BigInteger, nullable=False),
    sa.Column("sha256", sa.String(64), nullable=False),
    sa.Column("chunks", sa.Integer, nullable=False, server_default="0"),
    sa.Column("file_id", sa.String(40), nullable=True),  # when added from an uploaded file
    sa.Column("created_at", sa.Float, nullable=False),
)
sa.Index(
    "ix_dataset_documents_dataset", dataset_documents.c.dataset_id, dataset_documents.c.created_at
)

dataset_chunks = sa.Table(
    "dataset_chunks",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("dataset_id", sa.String(40), nullable=False),
    sa.Column("document_id", sa.String(40), nullable=False),
    sa.Column("idx", sa.Integer, nullable=False),  # the chunk's place in its document
    sa.Column("text", sa.Text, nullable=False),
    sa.Column("search_text", sa.Text, nullable=False),  # what the index sees (CJK spaced)
    sa.Column("source", sa.String(500), nullable=False),  # "name", "name, p. 3", "name › heading"
    sa.Column("embedding", sa.JSON, nullable=True),
    sa.Column("created_at", sa.Float, nullable=False),
)
sa.Index("ix_dataset_chunks_dataset", dataset_chunks.c.dataset_id)
sa.Index("ix_dataset_chunks_document", dataset_chunks.c.document_id, dataset_chunks.c.idx)

# --- schedules: a tenant's crons; each fired slot is one ``cron_fires`` row, whose primary
# key (cron_id, slot) makes a slot fire once fleet-wide (shared.engine.schedule) -------------
crons = sa.Table(
    "crons",
    metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("tenant", sa.String(64), nullable=False, server_default="default"),
    sa.Column("agent", sa.JSON, nullable=False),  # {"ref": "name@3"} or {"spec": {...}}
    sa.Column("input", sa.JSON, nullable=False),  # a run body's input
    sa.Column("schedule", sa.String(120), nullable=False),  # a cron expression
    sa.Column("timezone", sa.String(64), nullable=False, server_default="UTC"),
    sa.Column("thread_id", sa.String(64), nullable=True),
    sa.Column("meta", sa.JSON, nullable=True),  # the client's metadata (its runs get it)
    sa.Column("options", sa.JSON, nullable=True),  # facade options (LangGraph's)
    sa.Column("paused", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("next_fire", sa.Float, nullable=True),  # the next slot (None: paused)
    sa.Column("last_slot", sa.Float, nullable=True),  # the last slot fired
    sa.Column("last_run_id", sa.String(40), nullable=True),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
)
sa.Index("ix_crons_tenant_created", crons.c.tenant, crons.c.created_at)
sa.Index("ix_crons_next_fire", crons.c.next_fire)

cron_fires = sa.Table(
    "cron_fires",
    metadata,
    sa.Column("cron_id", sa.String(40), primary_key=True),
    sa.Column("slot", sa.Float, primary_key=True),
    sa.Column("run_id", sa.String(40), nullable=True),
    sa.Column("fired_at", sa.Float, nullable=False),
)

# --- long-term memory: a tenant's items, (namespace, key) -> JSON value (shared.store.memory).
# ``id`` is a digest of (tenant, namespace, key): the primary key stays short however long
# the key; ``namespace`` is the labels joined by "." (a label has none), so a namespace prefix
# is ``namespace = p OR namespace LIKE 'p.%'``; ``text`` is what search reads (keywords, and
# the embedding of it when an embeddings profile is configured) -----------------------------
memory_items = sa.Table(
    "memory_items",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("tenant", sa.String(64), nullable=False),
    sa.Column("namespace", sa.String(600), nullable=False),
    sa.Column("key", sa.String(1024), nullable=False),
    sa.Column("value", sa.JSON, nullable=False),
    sa.Column("text", sa.Text, nullable=False),
    sa.Column("embedding", sa.JSON, nullable=True),
    sa.Column("embedding_model", sa.String(200), nullable=True),
    sa.Column("ttl_s", sa.Float, nullable=True),  # a read may start it again (refresh_ttl)
    sa.Column("expires_at", sa.Float, nullable=True),
    sa.Column("run_id", sa.String(40), nullable=True),  # the run that wrote it last, if any
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
)
sa.Index("ix_memory_items_namespace", memory_items.c.tenant, memory_items.c.namespace)
sa.Index("ix_memory_items_expires", memory_items.c.expires_at)

spend_envelopes = sa.Table(
    # what a tenant may spend on models per day or calendar month (the operator's time zone):
    # its whole tenant (scope tenant, key ""), a named agent (any version) or a cron; a call
    # reserves its worst case here before it is sent and settles to its real cost after
    "spend_envelopes",
    metadata,
    sa.Column("tenant", sa.String(64), primary_key=True),
    sa.Column("scope", sa.String(8), primary_key=True),  # tenant | agent | cron
    sa.Column("key", sa.String(140), primary_key=True),
    sa.Column("period", sa.String(8), nullable=False),  # day | month
    sa.Column("cap", sa.Float, nullable=False),
    sa.Column("on_exceed", sa.String(8), nullable=False, server_default="wait"),  # wait | fail
    sa.Column("period_start", sa.Float, nullable=False),
    sa.Column("period_end", sa.Float, nullable=False),
    sa.Column("spent", sa.Float, nullable=False, server_default="0"),
    sa.Column("reserved", sa.Float, nullable=False, server_default="0"),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
)
