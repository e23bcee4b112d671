"""Filesystem weight transport: the trainer publishes versions, rollout workers pick them up.

Layout under ``root``::

    v00000007/   config.json, model.safetensors, tidal_complete   (a Hugging Face folder)
    LATEST       "7"  (written by temp file + rename, only after the folder is complete)

A reader only ever sees complete versions: ``save_pretrained`` writes into a hidden staging folder
and renames it into place with its completion marker, and LATEST moves after that. Old versions
are removed once ``keep`` newer ones exist; a worker that is still loading one of them retries
with the newest. The HTTP/delta transport (tidal.sync.weight_store: deltas through an origin on
loopback, one puller per worker) implements the same Protocols (tidal.sync.transport) and is the
default; ``sync.transport`` chooses (``open_weight_publisher`` on the driver,
``open_weight_source`` in each worker).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tidal.fsutil import write_atomic
from tidal.sync.transport import WeightPublisher, WeightSource


class FilesystemWeightStore(WeightPublisher, WeightSource):
    """Both ends in one class: the driver publishes into ``root``, workers read from it."""

    def __init__(self, root: str | Path, keep: int = 3):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.keep = keep

    @property
    def address(self) -> str:
        """What a worker passes to ``open_weight_source``: this store's folder."""
        return str(self.root)

    def close(self) -> None:
        pass

    def folder(self, version: int) -> Path:
        return self.root / f"v{version:08d}"

    def publish(self, model, version: int) -> None:
        from tidal.model import save_pretrained

        save_pretrained(model, self.folder(version))
        write_atomic(self.root / "LATEST", str(version).encode())
        self._collect_garbage(version)

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


def open_weight_publisher(cfg, root: Path) -> WeightPublisher:
    """The driver's end of the configured transport (``cfg.sync.transport``), publishing in the
    engines' dtype (``cfg.model.dtype``); its ``address`` is what workers open."""
    if cfg.sync.transport == "filesystem":
        return FilesystemWeightStore(root)
    from tidal.sync.weight_store import HttpWeightPublisher

    # the origin listens where the fleet's coordinator does (loopback by default), so remote
    # pools on other machines reach the weights at the address they reach the run at
    host = cfg.fleet.listen.rpartition(":")[0] or "127.0.0.1"
    return HttpWeightPublisher(root, cfg.sync, cfg.model.dtype, host=host)


def open_weight_source(cfg, address: str) -> WeightSource:
    """A worker's end of the configured transport, given the publisher's ``address``."""
    if cfg.sync.transport == "filesystem":
        return FilesystemWeightStore(address)
    from tidal.sync.weight_store import HttpWeightSource

    return HttpWeightSource(address, cfg.sync)
