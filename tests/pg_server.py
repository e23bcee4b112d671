"""A throwaway PostgreSQL server for the test session (Debian's ``postgresql`` binaries).

initdb into a temp dir, ``pg_ctl start`` on a free port (TCP on 127.0.0.1, its socket in the
temp dir), a fresh database per ``new_database()``, stopped and removed when the session ends.
PostgreSQL refuses to run as root, so as root (CI) initdb / pg_ctl run as the ``postgres``
system user (``runuser -u postgres --``) on a temp dir chowned to it. Missing binaries fail the
tests, naming the set-up step (``bash scripts/setup.sh --test``): PostgreSQL is tested for real.

Use: ``from pg_server import postgres_server`` in a test module (a session fixture; one server
is shared by every module that imports it).
"""

from __future__ import annotations

import atexit
import glob
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

START_TIMEOUT_S = 60
PG_GLOB = "/usr/lib/postgresql/*/bin/initdb"
SETUP_HINT = "run `bash scripts/setup.sh --test` (as root: it installs Debian's postgresql)"


def pg_bin() -> Path:
    """The newest installed PostgreSQL bin folder (or TIDAL_PG_BIN)."""
    if os.environ.get("TIDAL_PG_BIN"):
        found = [str(Path(os.environ["TIDAL_PG_BIN"]) / "initdb")]
    else:
        found = sorted(glob.glob(PG_GLOB), key=lambda p: int(p.split("/")[4]))
        found = found or [shutil.which("initdb") or ""]
    initdb = Path(found[-1])
    if not found[-1] or not initdb.is_file() or not (initdb.parent / "pg_ctl").is_file():
        pytest.fail(f"PostgreSQL is not installed (no initdb and pg_ctl in {PG_GLOB.rsplit('/', 1)[0]} "
                    f"or TIDAL_PG_BIN): {SETUP_HINT}", pytrace=False)
    return initdb.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    """One running server in a temp dir; ``url(db)`` names a database on it."""

    def __init__(self):
        self.bin = pg_bin()
        self.root = Path(tempfile.mkdtemp(prefix="tidal-pg-"))
        self.data, self.log = self.root / "data", self.root / "server.log"
        self.as_root = os.geteuid() == 0
        if self.as_root:
            shutil.chown(self.root, "postgres", "postgres")
        self._names = itertools.count()
        self.port = 0
        atexit.register(self.stop)  # also when the session is interrupted
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
                  "--no-sync", "--no-instructions")
        self._start()

    def _run(self, tool: str, *args: str) -> subprocess.CompletedProcess:
        cmd = [str(self.bin / tool), *args]
        if self.as_root:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=START_TIMEOUT_S)
        if p.returncode != 0:
            raise RuntimeError(f"{tool} failed ({p.returncode}): {p.stderr.strip() or p.stdout.strip()}")
        return p

    def _start(self) -> None:
        for attempt in range(3):  # a free port can be taken between choosing it and binding it
            self.port = _free_port()
            opts = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1"
            try:
                self._run("pg_ctl", "start", "-w", "-t", str(START_TIMEOUT_S), "-D", str(self.data),
                          "-l", str(self.log), "-o", opts)
                return
            except RuntimeError:
                if attempt == 2:
                    log = self.log.read_text() if self.log.exists() else ""
                    raise RuntimeError(f"PostgreSQL did not start; its log:\n{log[-2000:]}") from None

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh, empty database; its SQLAlchemy URL."""
        import psycopg

        name = f"t{os.getpid()}_{next(self._names)}"
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres",
                             autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        if not self.root.exists():
            return
        try:
            self._run("pg_ctl", "stop", "-D", str(self.data), "-m", "immediate", "-w")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


_server: PostgresServer | None = None
_users = 0


@pytest.fixture(scope="session")
def postgres_server():
    """The session's PostgreSQL server (started on first use, stopped after the last user)."""
    global _server, _users
    if _server is None:
        _server = PostgresServer()
    _users += 1
    yield _server
    _users -= 1
    if _users == 0:
        _server.stop()
        _server = None
