"""memory_items: a tenant's long-term memory, (namespace, key) -> JSON value, with a TTL

Revision ID: 0031
Revises: 0014
"""

import sqlalchemy as sa
from alembic import op

revision = "0031"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "memory_items",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("tenant", sa.String(length=64), nullable=False),
        sa.Column("namespace", sa.String(length=600), nullable=False),
        sa.Column("key", sa.String(length=1024), nullable=False),
        sa.Column("value", sa.JSON(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("embedding", sa.JSON(), nullable=True),
        sa.Column("embedding_model", sa.String(length=200), nullable=True),
        sa.Column("ttl_s", sa.Float(), nullable=True),
        sa.Column("expires_at", sa.Float(), nullable=True),
        sa.Column("run_id", sa.String(length=40), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_memory_items_namespace", "memory_items", ["tenant", "namespace"])
    op.create_index("ix_memory_items_expires", "memory_items", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_memory_items_expires", table_name="memory_items")
    op.drop_index("ix_memory_items_namespace", table_name="memory_items")
    op.drop_table("memory_items")
