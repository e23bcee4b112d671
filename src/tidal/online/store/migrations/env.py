"""Alembic environment: runs on the connection OnlineStore.open hands over (config.attributes).

On PostgreSQL a transaction-scoped advisory lock keeps two processes that open the store at once
(the server and its learner) from migrating side by side; on SQLite the write transaction
(BEGIN IMMEDIATE, database.py) does the same.
"""

from __future__ import annotations

from alembic import context

from tidal.online.store.schema import metadata

MIGRATION_LOCK = 0x7469_6461_6C00
"""pg_advisory_xact_lock key of the store's migrations ("tidal\\0")."""


def run_migrations_online() -> None:
    connection = context.config.attributes["connection"]
    context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK})")
        context.run_migrations()


if context.is_offline_mode():
    raise RuntimeError("the online store migrates online only (OnlineStore.open)")
run_migrations_online()
