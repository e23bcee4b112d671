"""`tidal bench controls` at toy size: each arm runs with its own keys and nothing else changed,
the same steps each, guard off but in the guarded arm; and the curve and guard figures of known
runs."""

import tomllib

import pytest

from tidal.bench import controls_bench
from tidal.bench.config import parse
from tidal.bench.controls_bench import ARMS, curve_figures, entropy_figures, guard_figures, run_controls
from tidal.config import ConfigError
from tidal.model.checkpoint import save_pretrained
from tidal.model.qwen3 import build_model

TINY = ["--model.hidden_size", "32", "--model.num_hidden_layers", "1",
        "--model.num_attention_heads", "2", "--model.num_key_value_heads", "1",
        "--model.head_dim", "16", "--model.intermediate_size", "64", "--engine.max_new_tokens", "12"]


def test_curve_figures_of_a_known_curve():
    f = curve_figures([(0, 0.2), (20, 0.5), (40, 0.3), (60, 0.6), (80, 0.55)])
    assert f["before"] == 0.2 and f["final"] == 0.55
    assert f["gain_points"] == pytest.approx(35.0)
    assert (f["best"], f["best_step"]) == (0.6, 60)
    assert f["largest_drop_points"] == pytest.approx(20.0)  # 0.5 at step 20, then 0.3


def test_guard_figures_count_restores_not_stops():
    event = {"detector": "heldout_drop", "evidence": {}, "lr_scale": 0.5, "version": 9, "wall_s": 1.0}
    guard = {"policy": "restore", "events": [
        {**event, "step": 40, "action": "restore", "restored_step": 20},
        {**event, "step": 80, "action": "stop", "restored_step": None}]}
    f = guard_figures(guard)
    assert f["restores"] == 1
    assert f["guard_events"] == [
        {"step": 40, "detector": "heldout_drop", "action": "restore", "restored_step": 20},
        {"step": 80, "detector": "heldout_drop", "action": "stop", "restored_step": None}]
    assert guard_figures(None) == {"guard_events": [], "restores": 0}


def test_entropy_figures_skip_the_step_that_restored():
    """A guarded run's restore step trained nothing and has no train/ figures (a fixit run of the
    guarded arm stopped on a KeyError there)."""
    rows = [{"kind": "eval", "step": 0}, {"kind": "step", "step": 1, "train/entropy": 0.3},
            {"kind": "step", "step": 2, "train/entropy": 0.1}, {"kind": "guard", "step": 2},
            {"kind": "step", "step": 3}, {"kind": "step", "step": 4, "train/entropy": 0.2}]
    assert entropy_figures(rows) == {"entropy_last": 0.2, "entropy_min": 0.1}
    assert entropy_figures([{"kind": "step", "step": 1}]) == {"entropy_last": None, "entropy_min": None}


def test_each_arm_runs_its_own_keys_and_the_same_steps(tmp_path):
    bench, cfg, _ = parse(controls_bench, "controls", [
        *TINY, "--bench.families", "funcs", "--bench.arms", "defaults,dual_clip,kl_initial,guarded",
        "--bench.steps", "2", "--bench.eval_every", "1",
        "--orchestrator.tasks_per_step", "2", "--orchestrator.group_size", "2",
        "--orchestrator.heldout_tasks", "2", "--orchestrator.eval_samples_per_task", "1",
        "--orchestrator.backend", "local", "--orchestrator.num_workers", "1",
        "--model.init_from", str(tmp_path / "ck"), "--bench.runs_dir", str(tmp_path / "runs")])
    save_pretrained(build_model(cfg.model.model_copy(update={"init_from": None}), seed=0), tmp_path / "ck")
    result = run_controls(bench, cfg)
    arms = result["by_family"]["funcs"]
    assert list(arms) == ["defaults", "dual_clip", "kl_initial", "guarded"]
    for arm, figures in arms.items():
        run_cfg = tomllib.loads((tmp_path / "runs" / "funcs" / f"{arm}-0" / "config.toml").read_text())
        trainer = run_cfg["trainer"]
        assert trainer["dual_clip"] == (3.0 if arm == "dual_clip" else 0.0)
        assert trainer["kl_coef"] == (0.04 if arm == "kl_initial" else 0.0)
        assert run_cfg["orchestrator"]["guard"]["policy"] == ("restore" if arm == "guarded" else "off")
        assert run_cfg["orchestrator"]["steps"] == 2
        assert figures["keys"] == ARMS[arm]
        (run,) = figures["runs"]
        assert run["steps"] == 2
        if arm != "guarded":
            assert run["guard_events"] == [] and run["restores"] == 0
        assert [s for s, _ in run["curve"]][:3] == [0, 1, 2]  # before, then every step


def test_an_unknown_arm_is_a_clear_error():
    bench, cfg, _ = parse(controls_bench, "controls", ["--bench.arms", "defaults,kl"])
    with pytest.raises(ConfigError, match="bench.arms.*kl_initial"):
        run_controls(bench, cfg)
