"""Alembic environment. The URL comes from the caller (`broker/store/migrate.py`)
or, for the alembic command line, from SPOTBROKER_DATABASE_URL."""
from __future__ import annotations

from alembic import context

from spotbroker.broker.settings import get_settings
from spotbroker.broker.store import models  # noqa: F401  (registers the tables)
from spotbroker.broker.store.db import Base, make_engine

config = context.config
target_metadata = Base.metadata


def run_migrations_offline() -> None:
    context.configure(url=config.get_main_option("sqlalchemy.url") or get_settings().sqlalchemy_url,
                      target_metadata=target_metadata, literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = make_engine(config.get_main_option("sqlalchemy.url") or get_settings().sqlalchemy_url)
    with engine.connect() as conn:
        _run(conn)
    engine.dispose()


def _run(connection) -> None:
    # render_as_batch: SQLite cannot ALTER most things; batch mode rebuilds the table.
    context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True,
                      compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
