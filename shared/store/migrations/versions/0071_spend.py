"""money: spend envelopes, a run's reservation for its call in flight, reasoning tokens

Revision ID: 0071
Revises: 0031
"""

import sqlalchemy as sa
from alembic import op

revision = "0071"
down_revision = "0031"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "spend_envelopes",
        sa.Column("tenant", sa.String(64), primary_key=True),
        sa.Column("scope", sa.String(8), primary_key=True),
        sa.Column("key", sa.String(140), primary_key=True),
        sa.Column("period", sa.String(8), nullable=False),
        sa.Column("cap", sa.Float, nullable=False),
        sa.Column("on_exceed", sa.String(8), nullable=False, server_default="wait"),
        sa.Column("period_start", sa.Float, nullable=False),
        sa.Column("period_end", sa.Float, nullable=False),
        sa.Column("spent", sa.Float, nullable=False, server_default="0"),
        sa.Column("reserved", sa.Float, nullable=False, server_default="0"),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("reserved", sa.Float, nullable=False, server_default="0"))
        batch.add_column(sa.Column("spend_keys", sa.JSON, nullable=True))
    with op.batch_alter_table("usage") as batch:
        batch.add_column(
            sa.Column("reasoning_tokens", sa.Integer, nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("usage") as batch:
        batch.drop_column("reasoning_tokens")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("spend_keys")
        batch.drop_column("reserved")
    op.drop_table("spend_envelopes")
