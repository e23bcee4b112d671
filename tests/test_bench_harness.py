"""tidal bench harness's own logic (its arms are `tidal train` runs, tested where they live):
what it refuses, how the native arm mirrors the gateway's, and its headline figures."""

from __future__ import annotations

import pytest

from tidal.bench import harness_bench
from tidal.config import ConfigError, load_config


def test_refuses_a_recipe_without_a_harness():
    with pytest.raises(ConfigError, match="env.name = 'harness'"):
        harness_bench.run(harness_bench.BenchSection(), load_config(None), None)


def test_the_native_arm_is_the_same_agent_with_the_gateways_budgets():
    cfg = load_config("harness")
    native = harness_bench.arm_config(cfg, "native")
    assert native.env.name == "agent"
    assert native.env.args == {"tasks": "funcs", "task_args": {"prompt_style": "instruct"}}
    assert (native.harness.max_turns, native.harness.max_tokens) == (
        cfg.env.args["max_turns"], cfg.env.args["max_tokens"])
    assert native.model == cfg.model and native.engine == cfg.engine
    assert harness_bench.arm_config(cfg, "gateway") is cfg


def test_headline_compares_the_gateway_with_the_native_arm():
    r = {"before": {"pass1": 0.10},
         "native": {"steps_per_min": 3.0, "after": {"pass1": 0.30}},
         "gateway": {"steps_per_min": 2.4, "after": {"pass1": 0.28}, "history_match_fraction": 1.0,
                     "bitwise_equal_fraction": 1.0, "turn_overhead_ms": 6.0}}
    h = harness_bench.headline(r)
    assert h["steps_per_min_ratio"] == pytest.approx(0.8)
    assert h["gain"] == pytest.approx(0.18) and h["native_gain"] == pytest.approx(0.20)
    assert (h["history_match_fraction"], h["bitwise_equal_fraction"], h["turn_overhead_ms"]) == (1.0, 1.0, 6.0)


def test_the_bitwise_fraction_counts_only_steps_that_compared_tokens():
    from tidal.bench.common import bitwise_equal_fraction

    steps = [{"train/mismatch_tokens": 10, "train/mismatch_bitwise_equal_fraction": 1.0},
             {"train/mismatch_tokens": 0, "train/mismatch_bitwise_equal_fraction": 0.0},
             {"train/mismatch_tokens": 5, "train/mismatch_bitwise_equal_fraction": 0.5}]
    assert bitwise_equal_fraction(steps) == pytest.approx(0.75)
    assert bitwise_equal_fraction(steps[1:2]) is None


def test_arms_are_given_as_a_comma_list_on_the_command_line():
    assert harness_bench.BenchSection(arms="native").arms == ["native"]
    assert harness_bench.BenchSection(arms="gateway,native").arms == ["gateway", "native"]
