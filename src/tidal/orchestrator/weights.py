"""Filesystem weight transport: the trainer publishes versions, rollout workers pick them up.

Layout under ``root``::

    v00000007/   config.json, model.safetensors, tidal_complete   (a Hugging Face folder)
    LATEST       "7"  (written by temp file + rename, only after the folder is complete)

A reader only ever sees complete versions: ``save_pretrained`` writes into a hidden staging folder
and renames it into place with its completion marker, and LATEST moves after that. Old versions
are removed once ``keep`` newer ones exist; a worker that is still loading one of them retries
with the newest. The HTTP/delta transport of the weight-sync issue replaces this class behind the
same two methods (``publish`` and ``latest_version`` / ``load``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


class FilesystemWeightStore:
    def __init__(self, root: str | Path, keep: int = 3):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.keep = keep

    def folder(self, version: int) -> Path:
        return self.root / f"v{version:08d}"

    def publish(self, model, version: int) -> Path:
        from tidal.model import save_pretrained

        folder = self.folder(version)
        save_pretrained(model, folder)
        tmp = self.root / f".LATEST.{os.getpid()}"
        tmp.write_text(str(version))
        os.replace(tmp, self.root / "LATEST")
        self._collect_garbage(version)
        return folder

    def latest_version(self) -> int | None:
        try:
            return int((self.root / "LATEST").read_text())
        except FileNotFoundError:
            return None

    def load(self, version: int, dtype):
        from tidal.model import from_pretrained

        return from_pretrained(self.folder(version), dtype=dtype)

    def _collect_garbage(self, newest: int) -> None:
        for child in self.root.glob("v*"):
            if child.is_dir() and child.name[1:].isdigit() and int(child.name[1:]) <= newest - self.keep:
                shutil.rmtree(child, ignore_errors=True)
