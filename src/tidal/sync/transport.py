"""The two ends of a weight transport, as `tidal train` uses them: one small interface, two
implementations (a debuggable one and a fast one).

    driver:   WeightPublisher.publish(model, version) ── transport ──> WeightSource (one per worker)
              .address: what a worker opens            .latest_version(); .load(version, dtype)

- FilesystemWeightStore (tidal.orchestrator.weights): one Hugging Face folder per version and an
  atomically written LATEST; both ends in one class. Easy to inspect, full copies every version.
- HttpWeightPublisher / HttpWeightSource (tidal.sync.weight_store): deltas through an origin on
  loopback, one verifying puller per worker; the default (``sync.transport``).

Both implement these Protocols explicitly (subclassing them), and tests/test_weights.py drives
every method of both through the Protocol alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch
    from torch import nn


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
