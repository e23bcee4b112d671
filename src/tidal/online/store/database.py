"""The engine under the store: SQLite in WAL mode (default) or PostgreSQL, from one URL.

SQLite: ``RUN_DIR/online.db``, ``journal_mode=WAL`` (readers never block the writer) and
``synchronous=FULL`` (the WAL is fsynced at every commit, so a committed transaction survives
``kill -9`` and power loss). pysqlite's own transaction handling is switched off: a write
transaction starts with ``BEGIN IMMEDIATE`` (it takes the write lock first, so a check-then-insert
inside it cannot race another process, and two writers never deadlock upgrading a read lock); a
read starts with a plain ``BEGIN``. PostgreSQL (``postgresql+psycopg://...``) keeps its defaults
(``synchronous_commit = on``: a commit returns once its WAL record is flushed).
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import sqlalchemy as sa
from sqlalchemy import event

from tidal.errors import UserError

DB_FILENAME = "online.db"
"""The SQLite file inside a run directory when ``online.store.database_url`` is empty."""

SQLITE_BUSY_TIMEOUT_S = 30.0
"""How long a SQLite connection waits for another process's write lock before failing."""


def resolve_url(url: str, run_dir: Path | None) -> str:
    """"" -> the run's SQLite file; anything else must name a supported backend."""
    if not url:
        if run_dir is None:
            raise UserError("the online store needs a run directory (--run-dir) or a database URL "
                            "(online.store.database_url / --database-url)")
        return f"sqlite:///{Path(run_dir).resolve() / DB_FILENAME}"
    try:
        backend = sa.engine.make_url(url).get_backend_name()
    except sa.exc.ArgumentError as e:
        raise UserError(f"online.store.database_url {url!r} is not a database URL: {e}") from None
    if backend not in ("sqlite", "postgresql"):
        raise UserError(f"online.store.database_url {url!r}: backend {backend!r} is not supported; "
                        "use sqlite:///PATH or postgresql+psycopg://user@host/db")
    return url


def make_engine(url: str) -> sa.Engine:
    """An engine for a resolved URL, with the durability settings above."""
    u = sa.engine.make_url(url)
    if u.get_backend_name() == "sqlite":
        if not u.database or u.database == ":memory:":
            raise UserError("the online store must be durable: an in-memory SQLite database is not")
        return _sqlite_engine(u)
    try:
        return sa.create_engine(u, pool_pre_ping=True)
    except ModuleNotFoundError as e:
        raise UserError(f"the database driver for {u.drivername!r} is not installed ({e}); "
                        "use postgresql+psycopg://") from None


def _sqlite_engine(u: sa.URL) -> sa.Engine:
    Path(u.database).parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(u, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S, "check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):
        dbapi_conn.isolation_level = None  # we emit BEGIN ourselves (below)
        cur = dbapi_conn.cursor()
        mode = cur.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode.lower() != "wal":
            raise UserError(f"{u.database}: SQLite refused WAL mode (got {mode!r}); "
                            "put the run directory on a local file system")
        cur.execute("PRAGMA synchronous=FULL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        write = conn.get_execution_options().get("tidal_write", True)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine


@contextmanager
def write_tx(engine: sa.Engine) -> Iterator[sa.Connection]:
    """One write transaction: committed when the block ends (durable on return), rolled back on
    an exception."""
    with engine.connect() as conn, conn.begin():
        yield conn


@contextmanager
def read_tx(engine: sa.Engine) -> Iterator[sa.Connection]:
    """One read-only transaction (a consistent snapshot; never takes SQLite's write lock)."""
    with engine.connect().execution_options(tidal_write=False) as conn, conn.begin():
        yield conn
