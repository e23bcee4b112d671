"""How `tidal train` moves weights to its rollout workers: one small interface, two
implementations (a debuggable one and a fast one), chosen by ``sync.transport``.

    driver:   WeightPublisher.publish(model, version) ── transport ──> WeightSource (one per worker)
              .address: what a worker opens            .latest_version(); .load(version, dtype)

- FilesystemWeightStore: one Hugging Face folder per version and an atomically written LATEST;
  both ends in one class. Easy to inspect, full copies every version.
- HttpWeightPublisher / HttpWeightSource: deltas through an origin on loopback, one verifying
  puller per worker; the default (``sync.transport = "http"``).

``open_weight_publisher`` (on the driver) and ``open_weight_source`` (in each worker) open the
configured one. Both implement the Protocols explicitly (subclassing them), and
tests/test_weights.py drives every method of both through the Protocol alone.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from tidal.fsutil import write_atomic
from tidal.sync.config import SyncConfig
from tidal.sync.origin import Publisher, ServerThread, make_app
from tidal.sync.pull import Puller
from tidal.sync.tensors import bits_of, cast_floats, serving_tensors

if TYPE_CHECKING:
    import torch
    from torch import nn


# ── The interface ─────────────────────────────────────────────────────────────────────────────────

@runtime_checkable
class WeightPublisher(Protocol):
    """The driver's end: publishes each new policy version for the rollout workers."""

    @property
    def address(self) -> str:
        """What a worker passes to ``open_weight_source`` (a folder, or the origin's URL)."""
        ...

    def publish(self, model: nn.Module, version: int) -> None:
        """Make ``model``'s weights available as ``version``; returns once a worker can load it."""
        ...

    def latest_version(self) -> int | None:
        """The newest published version; None before the first."""
        ...

    def close(self) -> None:
        """Stop serving (the HTTP origin); the published data may stay on disk."""
        ...


@runtime_checkable
class WeightSource(Protocol):
    """A rollout worker's end: what it polls and loads new weights from."""

    def latest_version(self) -> int | None:
        """The newest version the publisher has made available; None before the first."""
        ...

    def load(self, version: int, dtype: torch.dtype) -> nn.Module:
        """A model holding ``version``'s weights in ``dtype``, for Engine.load_weights. Raises
        FileNotFoundError or CheckpointError if that version is gone (workers then retry with
        the newest)."""
        ...


# ── The filesystem transport ──────────────────────────────────────────────────────────────────────
# The trainer publishes versions, rollout workers pick them up.
#
# Layout under ``root``::
#
#     v00000007/   config.json, model.safetensors, tidal_complete   (a Hugging Face folder)
#     LATEST       "7"  (written by temp file + rename, only after the folder is complete)
#
# A reader only ever sees complete versions: ``save_pretrained`` writes into a hidden staging folder
# and renames it into place with its completion marker, and LATEST moves after that. Old versions
# are removed once ``keep`` newer ones exist; a worker that is still loading one of them retries
# with the newest.

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


# ── The HTTP/delta transport ──────────────────────────────────────────────────────────────────────
# The driver publishes deltas through an origin; each worker pulls and verifies them:
#
#     driver:  HttpWeightPublisher ── Publisher (deltas, anchors) ── origin on loopback (a thread)
#     worker:  HttpWeightSource ── its own Puller ── verified tensors ── a model for Engine.load_weights

CONFIG_FILE = "config.json"


class HttpWeightPublisher(WeightPublisher):
    def __init__(self, root: str | Path, cfg: SyncConfig, dtype: str, host: str = "127.0.0.1"):
        """``dtype``: the serving dtype (the rollout engines' dtype; ``cfg.dtype_rules`` apply per
        tensor on top, as in `tidal sync publish`). The root starts empty: a
        run's workers are fresh, so earlier runs' versions are of no use to them."""
        shutil.rmtree(root, ignore_errors=True)
        self.dtype, self.rules = dtype, cfg.dtype_rules
        self.publisher = Publisher(root, cfg)
        self.server = ServerThread(make_app(self.publisher.store), host=host)

    @property
    def address(self) -> str:
        """The origin's URL."""
        return self.server.url

    def publish(self, model, version: int) -> None:
        from tidal.model.checkpoint import config_to_hf, to_hf_state_dict

        tensors = serving_tensors(to_hf_state_dict(model), self.dtype, self.rules)
        config = json.dumps(config_to_hf(model.config, self.dtype)).encode()
        self.publisher.publish([bits_of(k, v) for k, v in tensors.items()], {CONFIG_FILE: config},
                               version=version)

    def latest_version(self) -> int | None:
        return self.publisher.head_version

    def close(self) -> None:
        self.server.stop()


class HttpWeightSource(WeightSource):
    def __init__(self, address: str, cfg: SyncConfig):
        self.cfg = cfg
        self.puller = Puller([address], cfg)
        self._asked_at, self._latest = float("-inf"), None

    def latest_version(self) -> int | None:
        """The origin's newest version, asked at most every ``poll_interval_s`` (workers ask
        between decode steps)."""
        now = time.monotonic()
        if now - self._asked_at >= self.cfg.poll_interval_s:
            self._asked_at, self._latest = now, self.puller.latest()
        return self._latest

    def load(self, version: int, dtype):
        """Pull ``version`` (a delta from the one held, when cheaper) and wrap it as a model; the
        puller has checked every tensor's sha256 before this returns. The model's tensors are
        the puller's own arrays (no copy), which the next ``load`` changes in place: copy them
        out (Engine.load_weights does) before loading again, and never modify them."""
        from tidal.model.checkpoint import config_from_hf, model_from_hf_tensors

        self.puller.pull(version)
        dtype_name = str(dtype).removeprefix("torch.")
        cfg = config_from_hf(json.loads(self.puller.files[CONFIG_FILE]))
        cfg = cfg.model_copy(update={"dtype": dtype_name})
        tensors = {t.name: t.to_torch() for t in self.puller.tensors}
        return model_from_hf_tensors(cfg, cast_floats(tensors, dtype_name))


# ── Opening the configured one ────────────────────────────────────────────────────────────────────

def open_weight_publisher(sync: SyncConfig, root: Path, dtype: str, listen: str = "") -> WeightPublisher:
    """The driver's end of the configured transport (``sync.transport``), publishing in the
    engines' dtype (model.dtype); its ``address`` is what workers open. ``listen``: the fleet
    coordinator's host:port, where the origin listens too, so remote pools on other machines
    reach the weights at the address they reach the run at (loopback when empty)."""
    if sync.transport == "filesystem":
        return FilesystemWeightStore(root)
    host = listen.rpartition(":")[0] or "127.0.0.1"
    return HttpWeightPublisher(root, sync, dtype, host=host)


def open_weight_source(sync: SyncConfig, address: str) -> WeightSource:
    """A worker's end of the configured transport, given the publisher's ``address``."""
    if sync.transport == "filesystem":
        return FilesystemWeightStore(address)
    return HttpWeightSource(address, sync)
