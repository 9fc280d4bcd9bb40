"""schedules, retention and priority: runs gain priority (0-9, the broker message's) and ttl_s
(an ended run is purged that long after its last change); crons (a tenant's schedules) and
cron_fires (one row per fired slot: the unique key that makes a slot fire once fleet-wide)

Revision ID: 0012
Revises: 0011
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("priority", sa.Integer(), nullable=False, server_default="5"))
        batch_op.add_column(sa.Column("ttl_s", sa.Float(), nullable=True))
    op.create_index("ix_runs_tenant_status", "runs", ["tenant", "status"])
    op.create_index("ix_runs_status_updated", "runs", ["status", "updated_at"])
    op.create_index("ix_runs_ttl", "runs", ["ttl_s"])
    op.create_table(
        "crons",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("tenant", sa.String(length=64), nullable=False, server_default="default"),
        sa.Column("agent", sa.JSON(), nullable=False),
        sa.Column("input", sa.JSON(), nullable=False),
        sa.Column("schedule", sa.String(length=120), nullable=False),
        sa.Column("timezone", sa.String(length=64), nullable=False, server_default="UTC"),
        sa.Column("thread_id", sa.String(length=64), nullable=True),
        sa.Column("meta", sa.JSON(), nullable=True),
        sa.Column("options", sa.JSON(), nullable=True),
        sa.Column("paused", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("next_fire", sa.Float(), nullable=True),
        sa.Column("last_slot", sa.Float(), nullable=True),
        sa.Column("last_run_id", sa.String(length=40), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_crons_tenant_created", "crons", ["tenant", "created_at"])
    op.create_index("ix_crons_next_fire", "crons", ["next_fire"])
    op.create_table(
        "cron_fires",
        sa.Column("cron_id", sa.String(length=40), nullable=False),
        sa.Column("slot", sa.Float(), nullable=False),
        sa.Column("run_id", sa.String(length=40), nullable=True),
        sa.Column("fired_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("cron_id", "slot", name="pk_cron_fires"),
    )


def downgrade() -> None:
    op.drop_table("cron_fires")
    op.drop_index("ix_crons_next_fire", table_name="crons")
    op.drop_index("ix_crons_tenant_created", table_name="crons")
    op.drop_table("crons")
    op.drop_index("ix_runs_ttl", table_name="runs")
    op.drop_index("ix_runs_status_updated", table_name="runs")
    op.drop_index("ix_runs_tenant_status", table_name="runs")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("ttl_s")
        batch_op.drop_column("priority")
