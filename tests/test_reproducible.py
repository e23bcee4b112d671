"""Reproducible runs: the same config and seed on the same machine give the same bits.

Mid-training (the default environment's corpus) twice, each in its own spawned process (the
path `tidal train` takes) with a different OpenMP wait policy and hash seed, with
run.pretrain_threads = 0 so the thread tuner switches between 1 and all cores by timing: every
logged loss and every weight must be equal. Held-out evaluation of one checkpoint: the same on a
fresh engine and on one that has evaluated before. Then synchronous RL (max_staleness = 0) from
that checkpoint, twice with two workers and once with one: every learning metric (rewards,
losses, grad norms, entropy, held-out pass@1) must be equal; only timings may differ. The RL
environment is defined here so that a barely trained model earns varied rewards (nonzero
advantages, so the trainer's gradients are part of what is compared).
"""

import json
import sys

import pytest
import torch
from safetensors.torch import load_file

from tidal.config import load_config
from tidal.engine.engine import Engine
from tidal.env import from_config
from tidal.env.base import Environment, StepResult
from tidal.env.spec import EnvironmentSpec
from tidal.model import from_pretrained, load_tokenizer
from tidal.orchestrator.evaluate import heldout_pass1
from tidal.orchestrator.loop import run_rl
from tidal.pretrain.cache import cached_pretrained
from tidal.pretrain.loop import METRICS_FILE

MODEL = ["--model.hidden_size", "32", "--model.intermediate_size", "64", "--model.num_hidden_layers", "2",
         "--model.num_attention_heads", "2", "--model.num_key_value_heads", "1", "--model.head_dim", "16",
         "--model.max_position_embeddings", "128", "--model.dtype", "float32"]
# batch 32 x 63 predicted positions: weight-gradient matmuls with an inner dimension of 2016,
# long enough that MKL splits it among threads (it does from ~1000 on).
PRETRAIN = ["--pretrain.seq_len", "64", "--pretrain.batch_size", "32", "--pretrain.max_steps", "24",
            "--pretrain.warmup_steps", "4", "--pretrain.lr", "1e-2", "--pretrain.log_every", "1",
            "--pretrain.corpus_docs", "300", "--run.pretrain_threads", "0", "--pretrain.dtype", "float32"]
RL = ["--engine.max_seq_len", "96", "--engine.max_new_tokens", "16", "--trainer.lr", "1e-3",
      "--orchestrator.steps", "3", "--orchestrator.tasks_per_step", "4", "--orchestrator.group_size", "4",
      "--orchestrator.heldout_tasks", "6", "--orchestrator.eval_every", "2",
      "--orchestrator.checkpoint_every", "0", "--orchestrator.max_staleness", "0",
      "--orchestrator.backend", "local", "--orchestrator.num_workers", "2"]

TIMING_KEYS = {"wall_s", "step_time_s", "generate_s", "grade_s", "train_s", "publish_s",
               "gen_tokens_per_s", "train_tokens_per_s", "worker_busy_fraction", "train/step_time_s"}


def cfg_with(tmp_path, *extra):
    return load_config(None, [*MODEL, *PRETRAIN, *RL, "--pretrain.cache_dir", str(tmp_path), *extra])


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """Two mid-trainings of one config, each in a fresh spawned process; their model folders."""
    root = tmp_path_factory.mktemp("pretrain")
    envs = [{"OMP_WAIT_POLICY": None, "PYTHONHASHSEED": "1"}, {"OMP_WAIT_POLICY": "PASSIVE", "PYTHONHASHSEED": "2"}]
    return [cached_pretrained(cfg_with(root / f"cache{i}"), progress=False, child_env=env)
            for i, env in enumerate(envs)]


@pytest.mark.slow
def test_mid_training_twice_gives_the_same_losses_and_weights(pretrained):
    curves = [[json.loads(line) for line in (p.parent / METRICS_FILE).read_text().splitlines()]
              for p in pretrained]
    threads = {r["threads"] for r in curves[0] + curves[1]}
    for field in ("loss", "lr"):
        a, b = ([r[field] for r in c] for c in curves)
        assert a == b, f"{field} differs first at step {_first_difference(a, b) + 1}: {threads=}"
    weights = [load_file(p / "model.safetensors") for p in pretrained]
    assert weights[0].keys() == weights[1].keys()
    differ = [k for k in weights[0] if not torch.equal(weights[0][k], weights[1][k])]
    assert not differ, f"{len(differ)} of {len(weights[0])} tensors differ, e.g. {differ[:3]}"


@pytest.mark.slow
def test_synchronous_rl_gives_the_same_metrics_whatever_the_workers(pretrained, tmp_path):
    init = pretrained[0]
    cfg = cfg_with(tmp_path, "--env.name", __name__)
    one_worker = cfg_with(tmp_path, "--env.name", __name__, "--orchestrator.num_workers", "1")
    runs = [learning_records(cfg, tmp_path / "a", init), learning_records(cfg, tmp_path / "b", init),
            learning_records(one_worker, tmp_path / "c", init)]
    steps = [r for r in runs[0] if r["kind"] == "step"]
    assert len(steps) == 3 and any(r["train/grad_norm"] > 0 for r in steps)  # something was learnt
    assert runs[0] == runs[1], _diff(runs[0], runs[1])
    assert runs[0] == runs[2], "one worker instead of two: " + _diff(runs[0], runs[2])


def test_evaluating_one_checkpoint_again_gives_the_same_result(pretrained, tmp_path):
    """Held-out pass@1 of one checkpoint: the same whether the engine is fresh or has evaluated
    before, and for the other mid-training's (bit-equal) checkpoint."""
    cfg = cfg_with(tmp_path, "--env.name", __name__)
    env = from_config(cfg.env)
    tasks = env.sample_tasks(8, cfg.orchestrator.heldout_seed, True)

    def evaluate(engine):
        result = heldout_pass1(engine, env, tasks, cfg.harness, 2, cfg.run.seed)
        return {k: v for k, v in result.items() if k != "tokens_per_s"}

    used = engine_of(pretrained[0], cfg)
    first, again = evaluate(used), evaluate(used)
    assert 0 < first["reward_mean"] < 1
    assert first == again == evaluate(engine_of(pretrained[1], cfg))


def engine_of(model_dir, cfg) -> Engine:
    model = from_pretrained(model_dir, dtype=cfg.model.dtype)
    return Engine(model, load_tokenizer(model_dir), cfg.engine)


def learning_records(cfg, run_dir, init) -> list[dict]:
    """The step and eval records of a run, without timings; and the held-out pass@1 summary."""
    summary = run_rl(cfg, run_dir, init, progress=False)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    records = [{k: v for k, v in r.items() if k not in TIMING_KEYS}
               for r in map(json.loads, lines) if r["kind"] in ("step", "eval")]
    return records + [{"kind": "summary", "before": summary.heldout_pass1_before,
                       "after": summary.heldout_pass1_after}]


def _first_difference(a: list, b: list) -> int:
    return next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)


def _diff(a: list[dict], b: list[dict]) -> str:
    for x, y in zip(a, b):
        keys = sorted(k for k in x.keys() | y.keys() if x.get(k) != y.get(k))
        if keys:
            return f"{x['kind']} {x.get('step')}: " + ", ".join(f"{k} {x.get(k)} vs {y.get(k)}" for k in keys[:4])
    return f"{len(a)} vs {len(b)} records"


# ---------------------------------------------------------------- the environment of the RL runs


class LettersEnvironment(Environment):
    """One turn; reward = 5 x the fraction of the turn's characters that are lowercase letters,
    capped at 1: an untrained byte-level model earns rewards spread over [0, 1]."""

    async def reset(self, task) -> str:
        return task.prompt

    async def step(self, action: str) -> StepResult:
        letters = sum(c.islower() for c in action) / max(len(action), 1)
        return StepResult("", min(1.0, 5 * letters), True, {"reason": "graded"})


class LettersTask:
    def __init__(self, i: int, heldout: bool):
        self.task_id = f"{'h' if heldout else 't'}{i}"
        self.prompt = f"# write letters ({self.task_id})\n"


def load_environment() -> EnvironmentSpec:
    """env.name = this module (tidal.env.registry imports it by path)."""
    return EnvironmentSpec(
        name="letters", make=LettersEnvironment,
        sample_tasks=lambda n, seed, heldout: [LettersTask(seed * 1000 + i, heldout) for i in range(n)],
    )


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
