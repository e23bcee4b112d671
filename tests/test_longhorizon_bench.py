"""`tidal bench horizon` end to end at toy size: mid-train (cached), evaluate, RL in both modes."""

import json

import pytest

from tidal.bench.horizon_bench import HorizonBenchConfig, WindowSetup, midtrain, run_horizon_bench


def toy(tmp_path) -> HorizonBenchConfig:
    # Short episodes (1.2 windows), a few seconds of mid-training, one RL step per mode.
    return HorizonBenchConfig(windows=[384], horizon=1.2, demo_episodes=4, drill_s=2.0, pretrain_s=2.0,
                              rl_s=60.0, rl_max_steps=1, tasks_per_step=1, group_size=2,
                              eval_tasks=2, threads=1, cache_dir=str(tmp_path / "cache"))


@pytest.mark.slow  # ~15 s alone, ~30 s on a busy 2-core machine
def test_pipeline_at_toy_size_writes_every_figure(tmp_path):
    bc = toy(tmp_path)
    out = tmp_path / "horizon.json"
    result = run_horizon_bench(bc, out, progress=False, quick=True)
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    for key in ("summarize", "truncate", "before_rl"):
        assert 0.0 <= result[key]["success"] <= 1.0
    w = result["by_window"]["384"]
    assert w["rl_summarize"]["steps"] == w["rl_truncate"]["steps"] == 1
    assert w["expert_effective_horizon"] >= 1.2
    assert result["effective_horizon"] > 0 and result["budget"] == "quick"
    assert w["after_rl_summarize"]["episodes"] == 2
    # The second run reuses the cached mid-trained model (same key, nothing retrained).
    setups = [WindowSetup(384, bc)]
    model_dir, facts = midtrain(bc, setups, progress=False)
    assert facts == result["midtrain"] and (model_dir / "config.json").is_file()
