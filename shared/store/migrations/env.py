"""Alembic environment: runs against the engine handed in by ``shared.store.db.migrate``."""

from __future__ import annotations

from alembic import context

from shared.store.tables import metadata

config = context.config


def run() -> None:
    engine = config.attributes.get("connection_engine")
    if engine is None:
        from shared.store.db import get_engine

        engine = get_engine()
    with engine.connect() as conn:
        context.configure(
            connection=conn,
            target_metadata=metadata,
            render_as_batch=conn.dialect.name == "sqlite",
        )
        with context.begin_transaction():
            if conn.dialect.name == "postgresql":  # a migration may take its time
                conn.exec_driver_sql("SET LOCAL statement_timeout = 0")
                conn.exec_driver_sql("SET LOCAL lock_timeout = 0")
            context.run_migrations()
        conn.commit()


run()
