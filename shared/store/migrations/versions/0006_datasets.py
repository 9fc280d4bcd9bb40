"""datasets: knowledge base (documents, chunks, full-text index); runs by parent

The full-text index is per dialect: SQLite an FTS5 table over ``dataset_chunks.search_text``
(external content, kept in step by triggers); PostgreSQL a generated ``tsvector`` column with
a GIN index.

Revision ID: 0006
Revises: 0005
"""
import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_SQLITE_FTS = [
    "CREATE VIRTUAL TABLE dataset_chunks_fts USING fts5(search_text, content='dataset_chunks', "
    "content_rowid='id', tokenize='porter unicode61 remove_diacritics 2')",
    "CREATE TRIGGER dataset_chunks_ai AFTER INSERT ON dataset_chunks BEGIN "
    "INSERT INTO dataset_chunks_fts(rowid, search_text) VALUES (new.id, new.search_text); END",
    "CREATE TRIGGER dataset_chunks_ad AFTER DELETE ON dataset_chunks BEGIN "
    "INSERT INTO dataset_chunks_fts(dataset_chunks_fts, rowid, search_text) "
    "VALUES ('delete', old.id, old.search_text); END",
    "CREATE TRIGGER dataset_chunks_au AFTER UPDATE ON dataset_chunks BEGIN "
    "INSERT INTO dataset_chunks_fts(dataset_chunks_fts, rowid, search_text) "
    "VALUES ('delete', old.id, old.search_text); "
    "INSERT INTO dataset_chunks_fts(rowid, search_text) VALUES (new.id, new.search_text); END",
]
_PG_FTS = [
    "ALTER TABLE dataset_chunks ADD COLUMN tsv tsvector "
    "GENERATED ALWAYS AS (to_tsvector('english', search_text)) STORED",
    "CREATE INDEX ix_dataset_chunks_tsv ON dataset_chunks USING GIN (tsv)",
]


def upgrade() -> None:
    op.create_table(
        "datasets",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant", sa.String(length=64), server_default="default", nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("embedding_model", sa.String(length=200), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("tenant", "name", name="uq_datasets_tenant_name"),
    )
    op.create_table(
        "dataset_documents",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("dataset_id", sa.String(length=40), nullable=False),
        sa.Column("tenant", sa.String(length=64), server_default="default", nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("content_type", sa.String(length=100), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("chunks", sa.Integer(), server_default="0", nullable=False),
        sa.Column("file_id", sa.String(length=40), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_dataset_documents_dataset", "dataset_documents",
                    ["dataset_id", "created_at"], unique=False)
    op.create_table(
        "dataset_chunks",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("dataset_id", sa.String(length=40), nullable=False),
        sa.Column("document_id", sa.String(length=40), nullable=False),
        sa.Column("idx", sa.Integer(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("search_text", sa.Text(), nullable=False),
        sa.Column("source", sa.String(length=500), nullable=False),
        sa.Column("embedding", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_dataset_chunks_dataset", "dataset_chunks", ["dataset_id"], unique=False)
    op.create_index("ix_dataset_chunks_document", "dataset_chunks", ["document_id", "idx"],
                    unique=False)
    op.create_index("ix_runs_parent", "runs", ["parent_run_id"], unique=False)
    fts = {"sqlite": _SQLITE_FTS, "postgresql": _PG_FTS}.get(op.get_bind().dialect.name, [])
    for statement in fts:
        op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        for name in ("dataset_chunks_ai", "dataset_chunks_ad", "dataset_chunks_au"):
            op.execute(f"DROP TRIGGER IF EXISTS {name}")
        op.execute("DROP TABLE IF EXISTS dataset_chunks_fts")
    op.drop_index("ix_runs_parent", table_name="runs")
    op.drop_index("ix_dataset_chunks_document", table_name="dataset_chunks")
    op.drop_index("ix_dataset_chunks_dataset", table_name="dataset_chunks")
    op.drop_table("dataset_chunks")
    op.drop_index("ix_dataset_documents_dataset", table_name="dataset_documents")
    op.drop_table("dataset_documents")
    op.drop_table("datasets")
