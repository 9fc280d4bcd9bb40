"""bounded attempts and on-time re-sends: a round's attempts and its last error on the run,
when its dispatch was sent, and what each worker has taken from its queues

Revision ID: 0014
Revises: 0013
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("attempts", sa.Integer, nullable=False, server_default="0"))
        batch.add_column(sa.Column("last_error", sa.JSON, nullable=True))
        batch.add_column(sa.Column("dispatched_at", sa.Float, nullable=True))
    with op.batch_alter_table("workers") as batch:
        batch.add_column(sa.Column("received", sa.JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("received")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("dispatched_at")
        batch.drop_column("last_error")
        batch.drop_column("attempts")
