"""fleet control: a run's end time and its suspend request; the search indexes

``runs.ended_at``: when the run last ended (None while it has not); ``runs.suspend_at``: when a
suspend was asked of a run whose round or tools were in flight (its next round boundary parks
it). Agent tags (``agent_tags``): a name's ``prod``/``staging`` pointers to its versions. On PostgreSQL a GIN index over the runs'
metadata serves ``metadata.<key>=<value>`` search by containment.

Revision ID: 0084
Revises: 0071
"""

import sqlalchemy as sa
from alembic import op

revision = "0084"
down_revision = "0071"
branch_labels = None
depends_on = None

FINAL = ("completed", "failed", "cancelled")


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("ended_at", sa.Float, nullable=True))
        batch.add_column(sa.Column("suspend_at", sa.Float, nullable=True))
    runs = sa.table(
        "runs", sa.column("status", sa.String), sa.column("ended_at"), sa.column("updated_at")
    )
    op.execute(runs.update().where(runs.c.status.in_(FINAL)).values(ended_at=runs.c.updated_at))
    op.create_index("ix_runs_tenant_ended", "runs", ["tenant", "ended_at"])
    op.create_table(
        "agent_tags",
        sa.Column("tenant", sa.String(64), primary_key=True),
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("tag", sa.String(32), primary_key=True),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "CREATE INDEX ix_run_specs_meta ON run_specs USING gin ((meta::jsonb) jsonb_path_ops)"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP INDEX IF EXISTS ix_run_specs_meta")
    op.drop_table("agent_tags")
    op.drop_index("ix_runs_tenant_ended", "runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("suspend_at")
        batch.drop_column("ended_at")
