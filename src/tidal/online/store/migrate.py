"""Bring a database to the schema this code knows, at every open (Alembic, run in-process).

A fresh database is created at head; one made by an older tidal is upgraded; one whose revision
this code does not know (made by a newer tidal) is refused with a clear error, untouched.
"""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from tidal.errors import UserError

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def alembic_config(connection: sa.Connection | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = connection
    return cfg


def known_revisions() -> set[str]:
    return {s.revision for s in ScriptDirectory.from_config(alembic_config()).walk_revisions()}


def head_revision() -> str:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current_revision(engine: sa.Engine) -> str | None:
    with engine.connect().execution_options(tidal_write=False) as conn:
        return MigrationContext.configure(conn).get_current_revision()


def migrate(engine: sa.Engine, where: str) -> None:
    """Upgrade to head (a no-op when already there)."""
    current = current_revision(engine)
    if current is not None and current not in known_revisions():
        raise UserError(f"the online store at {where} has schema revision {current!r}, newer than this "
                        f"tidal knows (head {head_revision()!r}): upgrade tidal to open it")
    if current == head_revision():
        return
    with engine.connect() as conn:
        command.upgrade(alembic_config(conn), "head")
        if conn.in_transaction():
            conn.commit()
