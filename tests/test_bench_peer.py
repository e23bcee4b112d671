"""tidal bench peer's own logic (the arms are `tidal train` and tests/test_bench_peer_trl.py's
module, each tested where it lives): what it refuses, and its headline figures."""

from __future__ import annotations

import pytest

from tidal.bench import peer_bench
from tidal.config import ConfigError, load_config


def test_refuses_a_recipe_without_a_pretrained_model():
    with pytest.raises(ConfigError, match="tidal bench peer smollm2"):
        peer_bench.run(peer_bench.BenchSection(), load_config(None), None)


def test_headline_compares_both_arms_against_one_before():
    r = {"before": {"funcs": 0.10, "requests": 0.50},
         "tidal": {"completions_per_min": 90.0, "after": {"funcs": 0.35, "requests": 0.50},
                   "bitwise_equal_fraction": 1.0, "checkpoint": "/x"},
         "trl": {"completions_per_min": 15.0, "after": {"funcs": 0.20, "requests": 0.45}},
         "engine_vs_generate": {"ratio": 4.0}}
    p = peer_bench.headline(r)
    assert p["completions_per_min_ratio"] == pytest.approx(6.0)
    assert p["tidal_gain"] == pytest.approx(0.25) and p["trl_gain"] == pytest.approx(0.10)
    assert p["tidal_other_change"] == pytest.approx(0.0) and p["trl_other_change"] == pytest.approx(-0.05)
    assert p["bitwise_equal_fraction"] == 1.0 and p["engine_vs_generate"] == 4.0
    assert p["tidal_checkpoint"] == "/x"


def test_arm_rss_is_the_arms_alone(tmp_path):
    """The wrapper reports the peak RSS of the command it ran, not of this process."""
    import sys

    small = peer_bench._measured([sys.executable, "-c", "pass"], tmp_path / "a")
    big = peer_bench._measured([sys.executable, "-c", "b = bytearray(300 << 20); b[::4096] = b'x' * len(b[::4096])"],
                               tmp_path / "b")
    assert big - small > 250 * 1024  # KiB
