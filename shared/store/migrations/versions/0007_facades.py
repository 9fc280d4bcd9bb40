"""facades: segments of treadle runs seen as LangGraph runs / OpenAI responses

Revision ID: 0007
Revises: 0006
"""
import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "facade_segments",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("protocol", sa.String(length=16), nullable=False),
        sa.Column("tenant", sa.String(length=64), server_default="default", nullable=False),
        sa.Column("thread_id", sa.String(length=40), nullable=True),
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("from_seq", sa.Integer(), nullable=False),
        sa.Column("to_seq", sa.Integer(), nullable=True),
        sa.Column("assistant_id", sa.String(length=200), nullable=False),
        sa.Column("meta", sa.JSON(), nullable=True),
        sa.Column("options", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("protocol", "run_id", "from_seq", name="uq_facade_segments_leg"),
    )
    with op.batch_alter_table("facade_segments", schema=None) as batch_op:
        batch_op.create_index("ix_facade_segments_thread", ["thread_id", "created_at"],
                              unique=False)
        batch_op.create_index("ix_facade_segments_run", ["run_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("facade_segments", schema=None) as batch_op:
        batch_op.drop_index("ix_facade_segments_run")
        batch_op.drop_index("ix_facade_segments_thread")
    op.drop_table("facade_segments")
