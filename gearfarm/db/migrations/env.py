"""Alembic environment: always online, on the connection gearfarm.db.results.upgrade hands over, so
the upgrade shares that connection's transaction and lock. Batch mode lets SQLite alter tables."""

from __future__ import annotations

from alembic import context

from gearfarm.db.results import Base

config = context.config
connection = config.attributes.get("connection")
if connection is None:
    # Run from the alembic command line: connect to the URL it was given.
    from sqlalchemy import create_engine

    engine = create_engine(config.get_main_option("sqlalchemy.url") or "sqlite:///gearfarm.db")
    with engine.begin() as conn:
        context.configure(connection=conn, target_metadata=Base.metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
else:
    context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()
