"""thread ids up to 64 characters: a LangGraph client's thread name is stored scoped to its
tenant (``<name>~<digest>``, shared.interop.thread_ids), so tenants' names never collide

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

COLUMNS = (("threads", "id"), ("runs", "thread_id"), ("facade_segments", "thread_id"))


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":  # SQLite does not enforce a length
        return
    for table, column in COLUMNS:
        op.alter_column(table, column, type_=sa.String(64), existing_type=sa.String(40))


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, column in COLUMNS:
        op.alter_column(table, column, type_=sa.String(40), existing_type=sa.String(64))
