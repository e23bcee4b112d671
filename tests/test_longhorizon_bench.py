"""`tidal bench horizon` at toy size: it runs tidal's own RL loop per window and mode and reports
what those runs recorded."""

import json
import tomllib
from pathlib import Path

import pytest

from tidal.bench import horizon_bench
from tidal.bench.config import THREADS_KEY, parse
from tidal.bench.horizon_bench import bench_config, budget_label, run_horizon_bench
from tidal.bench.horizon_runs import MODES
from tidal.config import ConfigError
from tidal.telemetry.metrics import read_metrics

TOY = ["--bench.windows", "320", "--bench.horizon", "2.5", "--bench.demo_episodes", "4",
       "--bench.drill_steps", "3", "--pretrain.max_steps", "2", "--orchestrator.steps", "1",
       "--orchestrator.tasks_per_step", "1", "--orchestrator.group_size", "2",
       "--orchestrator.heldout_tasks", "2", f"--{THREADS_KEY}", "1",
       "--bench.modes", "summarize,summarize_check,truncate"]
"""Episodes 2.5 windows long (long enough that a sliding window has dropped every step by the
time f is written), a few steps of mid-training, one RL step of 2 episodes per mode (all three), 2
held-out tasks."""


def toy_args(tmp: Path, runs: str, *extra: str) -> list[str]:
    return [*TOY, "--pretrain.cache_dir", str(tmp / "cache"), "--bench.runs_dir", str(tmp / runs), *extra]


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("horizon")
    bench, cfg, json_path = parse(horizon_bench, "horizon", toy_args(tmp, "runs", "--json", str(tmp / "h.json")))
    return tmp, run_horizon_bench(bench, cfg, json_path, progress=False)


def runs_of(result: dict) -> dict[str, Path]:
    assert result["modes"] == list(MODES)
    return {mode: Path(result["by_window"]["320"][f"rl_{mode}"]["run_dir"]) for mode in MODES}


@pytest.mark.slow  # ~35 s on a busy 2-core machine
def test_the_figures_are_what_each_run_recorded(toy):
    tmp, result = toy
    assert json.loads((tmp / "h.json").read_text()) == json.loads(json.dumps(result))
    w = result["by_window"]["320"]
    for mode, run_dir in runs_of(result).items():
        summary = json.loads((run_dir / "summary.json").read_text())
        records = read_metrics(run_dir / "metrics.jsonl")
        evals = {r["label"]: r for r in records if r["kind"] == "eval"}
        assert w[f"before_rl_{mode}"]["success"] == summary["heldout_pass1_before"] == evals["before"]["heldout_pass1"]
        assert w[f"after_rl_{mode}"]["success"] == summary["heldout_pass1_after"] == evals["after"]["heldout_pass1"]
        for when in ("before", "after"):
            figures = w[f"{when}_rl_{mode}"]
            for key in ("effective_horizon", "effective_horizon_min", "resets", "summary_tokens_mean", "tool_errors"):
                assert figures[key] == evals[when][f"episode/{key}"], (mode, when, key)
            assert figures["episodes"] == summary["heldout_tasks"] == 2
        steps = [r for r in records if r["kind"] == "step"]
        assert w[f"rl_{mode}"]["steps"] == summary["steps"] == len(steps) == 1
        assert [c["success"] for c in w[f"rl_{mode}"]["curve"]] == [r["pass_rate"] for r in steps]
    # One window: each headline figure is that window's.
    for mode in MODES:
        assert result[mode]["success"] == w[f"after_rl_{mode}"]["success"]
    assert result["before_rl"]["success"] == w["before_rl_summarize"]["success"]
    assert result["rl_gain_points"]["summarize_check"]["320"] == 100 * (
        w["after_rl_summarize_check"]["success"] - w["before_rl_summarize_check"]["success"])
    assert result["summarize_minus_truncate_points"] == 100 * (w["after_rl_summarize"]["success"]
                                                               - w["after_rl_truncate"]["success"])


@pytest.mark.slow
def test_both_modes_run_tidals_loop_with_one_config_but_the_mode(toy):
    _, result = toy
    configs = {m: tomllib.loads((d / "config.toml").read_text()) for m, d in runs_of(result).items()}
    for mode, c in configs.items():
        assert (c["harness"]["context_mode"], c["harness"]["summary_reward"]) == MODES[mode]
        assert c["harness"]["context_window"] == 320
        assert c["env"]["name"] == "ledger" and c["env"]["args"]["num_files"] == result["by_window"]["320"]["num_files"]
        assert (c["orchestrator"]["backend"], c["orchestrator"]["max_staleness"]) == ("local", 0)
        assert c["orchestrator"]["steps"] == 1 and c["trainer"]["lr"] == horizon_bench.DEFAULTS["trainer.lr"]
        c["harness"].pop("context_mode")
        c["harness"].pop("summary_reward")
    assert configs["summarize"] == configs["truncate"] == configs["summarize_check"]  # the same
    # budget, tasks and algorithm


@pytest.mark.slow
def test_the_expert_succeeds_only_with_summaries(toy):
    _, result = toy
    w = result["by_window"]["320"]
    assert w["expert_success"] == {"summarize": 1.0, "summarize_check": 1.0, "truncate": 0.0}
    assert w["expert_effective_horizon"] > 2.0 and w["expert_resets"] >= 2


@pytest.mark.slow
def test_a_second_invocation_reuses_the_mid_trained_model(toy, monkeypatch):
    tmp, first = toy

    def no_training(*args, **kwargs):
        raise AssertionError("mid-trained again")

    monkeypatch.setattr("tidal.pretrain.loop.pretrain", no_training)
    bench, cfg, _ = parse(horizon_bench, "horizon", toy_args(tmp, "again", "--orchestrator.steps", "0"))
    again = run_horizon_bench(bench, cfg, progress=False)
    assert first["midtrain"]["reused"] is False and again["midtrain"]["reused"] is True
    assert again["midtrain"]["model"] == first["midtrain"]["model"]
    # Each stage ends on its own steps (the drill's and the compared windows'), not the clock.
    assert (first["midtrain"]["drill"]["steps"], first["midtrain"]["steps"]) == (3, 2)
    assert again["by_window"]["320"]["rl_summarize"]["steps"] == 0


def test_budgets_are_labelled_by_what_ran():
    def label(*args):
        bench, cfg, _ = parse(horizon_bench, "horizon", list(args))
        return budget_label(bench, bench_config(bench, cfg))

    assert label() == "full" and label("--quick") == "quick"
    assert label("--trainer.lr", "3e-4") == "full"  # not a budget
    assert label("--orchestrator.time_budget_s", "60") == "custom"
    assert label("--quick", "--bench.drill_s", "0") == "custom"
    assert label("--bench.drill_steps", "900") == "custom"
    assert label("--pretrain.max_steps", "300") == "custom"


@pytest.mark.parametrize("args, words", [
    (["--env.name", "funcs"], "env.name must be 'ledger'"),
    (["--env.args.num_files", "9"], "env.args.num_files is chosen per window by --bench.horizon"),
    (["--bench.windows", "300,384"], "bench.windows: each must be >= 320"),
    (["--bench.modes", "summarize,dense"], "unknown arm 'dense'"),
    (["--bench.modes", "truncate"], "at least one of them summarize"),
    (["--bench.modes", "summarize,summarize"], "give each arm once"),
])
def test_settings_it_cannot_honour_are_one_clear_error(args, words):
    bench, cfg, _ = parse(horizon_bench, "horizon", args)
    with pytest.raises(ConfigError, match=words):
        bench_config(bench, cfg)
