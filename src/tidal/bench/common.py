"""What every ``tidal bench`` shares: writing its JSON result atomically, a run folder of its own,
and, for a benchmark whose arms are `tidal train` runs, the run in a child process and its
evaluation."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

from tidal.fsutil import write_text_atomic


def write_json(path: str | Path, data: dict) -> Path:
    """Write ``data`` as indented JSON via temp + rename, so a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_text_atomic(path, json.dumps(data, indent=2))


def starting_model(cfg, progress: bool = True) -> Path:
    """The model a benchmark's arms start from: model.init_from, else this config's mid-trained
    model (cached: mid-trained once, in a child process as `tidal train` does)."""
    if cfg.model.init_from:
        return Path(cfg.model.init_from)
    from tidal.openmp import pretrain_child_env
    from tidal.pretrain.cache import cached_pretrained

    return Path(cached_pretrained(cfg, progress=progress, child_env=pretrain_child_env()))


def new_run_dir(cfg, run_dir: Path) -> Path:
    """``run_dir`` made for one RL run of a benchmark, with the run's config.toml (so `tidal
    report` reads it); a ConfigError if a run is already there (its records would be mixed)."""
    from tidal.config import ConfigError
    from tidal.config.dump import recipe_tree, to_toml

    if (run_dir / "metrics.jsonl").exists():
        raise ConfigError(f"{run_dir} already holds a run: give another --bench.runs_dir")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.toml").write_text(to_toml(recipe_tree(cfg)) + "\n")
    return run_dir


def train_in_child(cfg, budget_s: float, run_dir: Path, recipe: Path,
                   launch=lambda command: subprocess.run(command, check=True)) -> tuple[dict, list[dict]]:
    """`tidal train` on ``cfg`` for ``budget_s`` seconds of RL in a child process (as a user runs
    it), its in-run evaluations cut to a few tasks (the benchmark evaluates), its recipe written
    to ``recipe``; (its summary.json, its step records). ``launch(command)`` runs the command (a
    failure stops the benchmark)."""
    from tidal.bench.config import with_keys
    from tidal.config.dump import recipe_tree, to_toml
    from tidal.telemetry.metrics import read_metrics

    arm = with_keys(cfg, {"orchestrator.time_budget_s": budget_s,
                          "orchestrator.steps": 100_000, "orchestrator.eval_every": 0,
                          "orchestrator.heldout_tasks": 8, "orchestrator.checkpoint_every": 0})
    run_dir.mkdir(parents=True, exist_ok=True)
    recipe.write_text(to_toml(recipe_tree(arm)) + "\n")
    launch([str(Path(sys.executable).with_name("tidal")), "train", str(recipe), "--run-dir", str(run_dir)])
    summary = json.loads((run_dir / "summary.json").read_text())
    steps = [r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("kind") == "step"]
    return summary, steps


def bitwise_equal_fraction(steps: list[dict]) -> float | None:
    """Mean over the steps that compared tokens of the fraction whose engine logprob equals the
    trainer's bit for bit (None when none did)."""
    fractions = [s["train/mismatch_bitwise_equal_fraction"] for s in steps
                 if s.get("train/mismatch_tokens")]
    return statistics.fmean(fractions) if fractions else None


def greedy_heldout(cfg, checkpoint, tasks: int, **keys) -> dict:
    """`tidal eval`'s result for a checkpoint folder: held-out pass@1 of ``tasks`` tasks of the
    run's environment, greedy, one sample each (``keys``: more run-config keys)."""
    from tidal.bench.config import with_keys
    from tidal.orchestrator.evaluate import evaluate_checkpoint
    from tidal.env import from_config
    from tidal.sandbox import Sandbox

    c = with_keys(cfg, {"orchestrator.eval_temperature": 0.0,
                        "orchestrator.eval_samples_per_task": 1, **keys})
    with Sandbox(c.env.sandbox) as sandbox:
        return evaluate_checkpoint(c, from_config(c.env, sandbox), Path(checkpoint), tasks)
