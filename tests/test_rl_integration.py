"""End to end on a tiny config: mid-train briefly, then GRPO through engine, sandbox and trainer.

Asserts that training reward rises and that the run's records keep their invariants (every token
has a version and a logprob, staleness within bounds, summary keys present).
"""

import json

import pytest

from tidal.config import load_config
from tidal.orchestrator.loop import run_rl
from tidal.pretrain.loop import pretrain

TINY = [
    "--model.hidden_size", "96", "--model.intermediate_size", "256", "--model.num_hidden_layers", "2",
    "--model.num_attention_heads", "4", "--model.num_key_value_heads", "2", "--model.head_dim", "24",
    "--env.args.max_level", "1", "--env.args.corpus_bug_rate", "0.5",
    # Mid-training by a step count, not a time budget, so a loaded machine gets the same model
    # (at 45 s of wall clock a machine shared with other jobs got 169 steps and a model that
    # solved nothing); the time budget is only a safety net.
    "--pretrain.corpus_docs", "4000", "--pretrain.max_steps", "400", "--pretrain.time_budget_s", "900",
    "--pretrain.batch_size", "16",
    "--engine.max_new_tokens", "40",
    "--orchestrator.steps", "60", "--orchestrator.tasks_per_step", "16",
    "--orchestrator.group_size", "8", "--orchestrator.heldout_tasks", "5",
    "--orchestrator.eval_every", "0", "--orchestrator.checkpoint_every", "0",
    "--orchestrator.time_budget_s", "3600",
    "--trainer.lr", "5e-4", "--orchestrator.backend", "local",
]


@pytest.mark.slow
def test_short_rl_run_raises_reward(tmp_path):
    cfg = load_config(None, TINY)
    init = pretrain(cfg, tmp_path / "pretrain", progress=False)
    summary = run_rl(cfg, tmp_path / "run", init, progress=False)
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rewards = [s["reward_mean"] for s in steps if s["kind"] == "step"]
    assert len(rewards) == 60
    early, late = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert late > early + 0.1, f"reward did not rise: first 10 steps {early:.3f}, last 10 {late:.3f}"
    assert summary.max_staleness_seen <= summary.max_staleness == 1
    assert summary.trajectories == 60 * 16 * 8
