"""agents over the API: agent_versions (immutable versions per tenant and name); run_specs
gains agent_ref (the named agent and version a run ran) and trace (its trace context)

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "agent_versions",
        sa.Column("tenant", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("meta", sa.JSON(), nullable=True),
        sa.Column("facade", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("tenant", "name", "version"),
    )
    with op.batch_alter_table("run_specs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("agent_ref", sa.String(length=140), nullable=True))
        batch_op.add_column(sa.Column("trace", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("run_specs", schema=None) as batch_op:
        batch_op.drop_column("trace")
        batch_op.drop_column("agent_ref")
    op.drop_table("agent_versions")
