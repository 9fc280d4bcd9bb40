"""run_specs.warnings: what was dropped from the run's spec, and why (SPEC P-5)

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("run_specs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("warnings", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("run_specs", schema=None) as batch_op:
        batch_op.drop_column("warnings")
