"""Both weight transports (filesystem, HTTP/delta) implement the WeightPublisher and WeightSource
Protocols and behave the same through them: every method of each, called on both."""

import time

import pytest
import torch
from test_orchestrator import cfg_with

from tidal.model import build_model
from tidal.sync.transport import (FilesystemWeightStore, HttpWeightPublisher, HttpWeightSource,
                                  WeightPublisher, WeightSource, open_weight_publisher, open_weight_source)


def test_both_transports_subclass_the_protocols():
    """Explicitly (not only by matching names), so a changed Protocol shows up in both."""
    for cls in (FilesystemWeightStore, HttpWeightPublisher):
        assert WeightPublisher in cls.__mro__
    for cls in (FilesystemWeightStore, HttpWeightSource):
        assert WeightSource in cls.__mro__


def newest(source: WeightSource, version: int, timeout_s: float = 10.0) -> int | None:
    deadline = time.monotonic() + timeout_s
    while (latest := source.latest_version()) != version and time.monotonic() < deadline:
        time.sleep(0.05)
    return latest


@pytest.mark.parametrize("transport", ["filesystem", "http"])
def test_a_published_version_loads_through_the_protocol(tmp_path, transport):
    cfg = cfg_with("--sync.transport", transport, "--model.dtype", "float32", "--trainer.dtype", "float32")
    model = build_model(cfg.model, seed=0)
    publisher = open_weight_publisher(cfg.sync, tmp_path / "weights", cfg.model.dtype)
    assert isinstance(publisher, WeightPublisher) and isinstance(publisher.address, str)
    try:
        source = open_weight_source(cfg.sync, publisher.address)
        assert isinstance(source, WeightSource)
        assert publisher.latest_version() is None and source.latest_version() is None
        publisher.publish(model, 0)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
        publisher.publish(model, 1)
        assert publisher.latest_version() == 1 and newest(source, 1) == 1
        loaded = source.load(1, torch.float32)
        want = dict(model.named_parameters())
        assert all(torch.equal(p, want[name]) for name, p in loaded.named_parameters())
    finally:
        publisher.close()
