"""tidal starts and supervises `vllm serve` for a rollout worker (engine.remote.launch).

    VllmServer.start():  weights_dir <- the initial checkpoint (config, weights, tokenizer)
                         `vllm serve weights_dir --port P ...` (VLLM_SERVER_DEV_MODE=1), its
                         output to weights_dir/../vllm.log; waits for GET /health
    supervise thread:    every second: exited? start it again (at most max_restarts times); it
                         loads weights_dir, which always holds the newest version written
    new version:         the worker's sync puller -> write_version(model, weights_dir)
                         -> POST /collective_rpc {"method": "reload_weights"} (RemoteEngine)

The command line (``vllm_command``): the model folder, host and port, dtype, max model length,
``--logprobs-mode processed_logprobs`` (logprobs of the distribution sampled, temperature
applied: tidal's convention), ``--max-logprobs 1``, a seed, the served model name, then
engine.remote.launch_args. vLLM is an optional extra (`pip install tidal[vllm]`); nothing
here imports it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

from tidal.errors import UserError

COPIED = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
          "special_tokens_map.json", "generation_config.json", "chat_template.jinja")
"""Files of the initial checkpoint put into weights_dir before the first start."""


class VllmServerError(UserError, RuntimeError):
    """The server could not be started, did not become healthy, or died too often."""


def host_port(url: str) -> tuple[str, int]:
    parsed = urlparse(url)
    if not parsed.hostname or not parsed.port:
        raise VllmServerError(f"engine.remote.url {url!r} must name a host and a port for a "
                              "launched server (e.g. http://127.0.0.1:8000)")
    return parsed.hostname, parsed.port


def vllm_command(remote, max_seq_len: int, dtype: str, seed: int = 0) -> list[str]:
    """The command line that serves ``remote.weights_dir`` at ``remote.url``'s port."""
    host, port = host_port(remote.url)
    return [*remote.launch_command, str(remote.weights_dir), "--host", host, "--port", str(port),
            "--dtype", dtype, "--max-model-len", str(max_seq_len),
            "--logprobs-mode", "processed_logprobs", "--max-logprobs", "1", "--seed", str(seed),
            "--served-model-name", remote.model or "tidal", *remote.launch_args]


def prepare_folder(init_checkpoint: str | Path, folder: str | Path) -> None:
    """Copy the initial checkpoint into ``folder`` unless it already holds a model."""
    folder, src = Path(folder), Path(init_checkpoint)
    folder.mkdir(parents=True, exist_ok=True)
    if (folder / "config.json").is_file():
        return
    for name in COPIED:
        if (src / name).is_file():
            shutil.copy2(src / name, folder / name)


class VllmServer:
    """One supervised server process. ``command``: its argv; ``health_url``: GET that answers
    200 once it serves; ``env``: extra environment."""

    def __init__(self, command: list[str], health_url: str, log_path: str | Path,
                 startup_timeout_s: float = 900.0, max_restarts: int = 3, env: dict | None = None):
        self.command, self.health_url, self.log_path = command, health_url, Path(log_path)
        self.startup_timeout_s, self.max_restarts = startup_timeout_s, max_restarts
        self.env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.restarts = 0
        self.failed: str | None = None
        """Why supervision gave up (the server died more than max_restarts times)."""
        self._stop = threading.Event()
        self._watch: threading.Thread | None = None

    @classmethod
    def for_config(cls, engine_cfg, init_checkpoint: str | Path, dtype: str, seed: int = 0):
        remote = engine_cfg.remote
        prepare_folder(init_checkpoint, remote.weights_dir)
        command = vllm_command(remote, engine_cfg.max_seq_len, dtype, seed)
        log = Path(remote.weights_dir).parent / f"vllm-{host_port(remote.url)[1]}.log"
        return cls(command, remote.url.rstrip("/") + "/health", log, remote.startup_timeout_s,
                   remote.max_restarts)

    def start(self) -> VllmServer:
        """Start the process, wait until healthy, then supervise it from a thread."""
        self._launch()
        atexit.register(self.stop)  # its own session: it would outlive this process otherwise
        self._watch = threading.Thread(target=self._supervise, daemon=True, name="tidal-vllm-watch")
        self._watch.start()
        return self

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.health_url, timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.join(timeout=5)
        self._kill()

    def _launch(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            try:
                self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                             env=self.env, start_new_session=True)
            except FileNotFoundError:
                raise VllmServerError(f"cannot start {self.command[0]!r}: not found; install the "
                                      "extra (pip install tidal[vllm]) or set "
                                      "engine.remote.launch_command") from None
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise VllmServerError(f"{' '.join(self.command[:2])} exited with code "
                                      f"{self.proc.returncode} before it was healthy; see "
                                      f"{self.log_path}")
            if self.healthy():
                return
            time.sleep(0.2)
        self._kill()
        raise VllmServerError(f"the server did not answer {self.health_url} within "
                              f"{self.startup_timeout_s:g} s (engine.remote.startup_timeout_s); "
                              f"see {self.log_path}")

    def _supervise(self) -> None:
        while not self._stop.wait(1.0):
            if self.proc is None or self.proc.poll() is None:
                continue
            if self.restarts >= self.max_restarts:
                self.failed = (f"the server died {self.restarts + 1} times (engine.remote."
                               f"max_restarts = {self.max_restarts}); see {self.log_path}")
                return
            self.restarts += 1
            try:
                self._launch()
            except VllmServerError as e:
                self.failed = str(e)
                return

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
