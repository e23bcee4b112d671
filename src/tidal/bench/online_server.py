"""`tidal serve` as the online benchmark runs it: a child process, started, waited for, killed.

The benchmark talks to the server only over HTTP and reads the run's store afterwards, as a
user's tooling would; the server runs the run config the benchmark was given (written out as
a recipe), with its own overrides on the command line. It gets two fresh API keys through the
environment (TIDAL_API_KEYS, TIDAL_ADMIN_KEYS): ``user_key`` for clients, ``admin_key`` for
rollout workers (weight updates) and the registry routes.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tidal.config.dump import recipe_tree, to_toml

READY = re.compile(r"listening on (http://\S+)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """``tidal serve`` in a child process; ``url`` once it printed that it listens."""

    def __init__(self, cfg, run_dir: Path, checkpoint: Path | None, overrides: list[str],
                 log_name: str = "serve.log"):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.recipe = self.run_dir / "bench_recipe.toml"
        self.recipe.write_text(to_toml(recipe_tree(cfg)))
        self.checkpoint = checkpoint
        self.overrides = overrides
        self.log_path = self.run_dir / log_name
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.user_key, self.admin_key = secrets.token_urlsafe(32), secrets.token_urlsafe(32)

    def headers(self, admin: bool = False) -> dict:
        """The Authorization header of the user key (or the admin key)."""
        return {"Authorization": f"Bearer {self.admin_key if admin else self.user_key}"}

    def start(self, timeout_s: float = 600.0) -> str:
        port = free_port()
        cmd = [sys.executable, "-m", "tidal", "serve", str(self.recipe), "--run-dir",
               str(self.run_dir), "--port", str(port), *self.overrides]
        if self.checkpoint is not None and not (self.run_dir / "online.db").exists():
            cmd += ["--checkpoint", str(self.checkpoint)]
        log = self.log_path.open("a")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1",
                                          "TIDAL_API_KEYS": self.user_key,
                                          "TIDAL_ADMIN_KEYS": self.admin_key},
                                     start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"tidal serve exited with {self.proc.returncode} before it "
                                       f"listened; see {self.log_path}")
                continue
            log.write(line)
            log.flush()
            match = READY.search(line)
            if match:
                self.url = match.group(1).rstrip("/")
                return self.url
        raise RuntimeError(f"tidal serve did not listen within {timeout_s:.0f} s; see {self.log_path}")

    def kill9(self) -> None:
        """SIGKILL the server and its children (the learner), as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill9()
