"""threads, and runs held behind their thread's active run

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 10:00:00.000000
"""
from alembic import op
import sqlalchemy as sa


revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('threads',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('tenant', sa.String(length=64), server_default='default', nullable=False),
    sa.Column('meta', sa.JSON(), nullable=True),
    sa.Column('multitask', sa.String(length=16), server_default='enqueue', nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('updated_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('threads', schema=None) as batch_op:
        batch_op.create_index('ix_threads_tenant_created', ['tenant', 'created_at'], unique=False)

    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('held', sa.Boolean(), server_default=sa.false(), nullable=False))


def downgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_column('held')

    with op.batch_alter_table('threads', schema=None) as batch_op:
        batch_op.drop_index('ix_threads_tenant_created')

    op.drop_table('threads')
