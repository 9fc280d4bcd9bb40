"""Run lineage: a run's transcript may start with another run's messages, read by reference
(``base_run_id`` up to ``base_seq``: a fork, or a thread's earlier runs); the spec revision
(a resume may override the spec); messages posted to a run that wait for its next round.

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("base_run_id", sa.String(40), nullable=True))
        batch_op.add_column(sa.Column("base_seq", sa.Integer(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("base_kind", sa.String(8), nullable=True))
        batch_op.add_column(sa.Column("fork_round", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("spec_rev", sa.Integer(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("steer", sa.JSON(), nullable=True))
    op.create_index("ix_runs_base", "runs", ["base_run_id"])


def downgrade() -> None:
    op.drop_index("ix_runs_base", table_name="runs")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        for name in ("steer", "spec_rev", "fork_round", "base_kind", "base_seq", "base_run_id"):
            batch_op.drop_column(name)
