"""lean runs: the hot row split from the run's spec, leases by worker heartbeat, per-message
token counts, rounds and tools dispatched from state (no outbox rows for them)

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_specs",
        sa.Column("run_id", sa.String(length=40), nullable=False),
        sa.Column("agent", sa.JSON(), nullable=False),
        sa.Column("inputs", sa.JSON(), nullable=True),
        sa.Column("meta", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("run_id"),
    )
    op.execute("INSERT INTO run_specs (run_id, agent, inputs, meta) SELECT id, agent, inputs, meta FROM runs")
    op.create_table(
        "workers",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("seen_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("agent")
        batch_op.drop_column("inputs")
        batch_op.drop_column("meta")
        batch_op.drop_column("lease_until")
        batch_op.add_column(sa.Column("redrives", sa.Integer(), server_default="0", nullable=False))
        batch_op.add_column(
            sa.Column("view_tokens", sa.Integer(), server_default="0", nullable=False)
        )
        batch_op.create_index("ix_runs_lease_owner", ["lease_owner"], unique=False)
    with op.batch_alter_table("messages", schema=None) as batch_op:
        batch_op.add_column(sa.Column("tokens", sa.Integer(), server_default="0", nullable=False))
    with op.batch_alter_table("tool_calls", schema=None) as batch_op:
        batch_op.drop_column("lease_until")
        batch_op.add_column(sa.Column("lease_owner", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("queued_at", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("redrives", sa.Integer(), server_default="0", nullable=False))
        batch_op.create_index("ix_tool_calls_open", ["status", "queued_at"], unique=False)
    op.execute("DELETE FROM outbox WHERE kind IN ('round', 'tool')")
    if op.get_bind().dialect.name == "postgresql":
        # room on each page for the hot row's new versions (HOT updates, no index writes)
        op.execute("ALTER TABLE runs SET (fillfactor = 70)")


def downgrade() -> None:
    with op.batch_alter_table("tool_calls", schema=None) as batch_op:
        batch_op.drop_index("ix_tool_calls_open")
        batch_op.drop_column("redrives")
        batch_op.drop_column("queued_at")
        batch_op.drop_column("lease_owner")
        batch_op.add_column(sa.Column("lease_until", sa.Float(), nullable=True))
    with op.batch_alter_table("messages", schema=None) as batch_op:
        batch_op.drop_column("tokens")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index("ix_runs_lease_owner")
        batch_op.drop_column("view_tokens")
        batch_op.drop_column("redrives")
        batch_op.add_column(sa.Column("lease_until", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("meta", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("inputs", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("agent", sa.JSON(), nullable=True))
    op.execute(
        "UPDATE runs SET agent = (SELECT agent FROM run_specs s WHERE s.run_id = runs.id),"
        " inputs = (SELECT inputs FROM run_specs s WHERE s.run_id = runs.id),"
        " meta = (SELECT meta FROM run_specs s WHERE s.run_id = runs.id)"
    )
    op.drop_table("workers")
    op.drop_table("run_specs")
