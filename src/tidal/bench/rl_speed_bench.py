"""RL steps per minute of the default recipe: tidal now vs tidal before the issue-17 speed work.

    tidal bench rl --json rl.json       # 2 x rounds runs of budget_s, each with start-up and 2 short evaluations
    tidal bench rl --bench.budget_s 120 --bench.rounds 1
    tidal bench rl --env.name fixit                                # another family

Both arms are tidal's own RL loop (``orchestrator.loop.Run``) from the same pretrained model
(the recipe's cached mid-training, made first if missing) with the same tasks, seeds and
wall-clock budget; the peer is the loop as it ran before (``BEFORE``): the trainer recomputing
every row's prompt (``trainer.share_prompts = false``), the engine prefilling every sample's
prompt (``engine.share_prompts = false``) and workers loading each new version in the middle of
their episodes with a KV-cache recompute (``orchestrator.in_flight_updates = true``), and every
episode's program graded in its own sandbox run (``env.sandbox.share_verdicts = false``). Each arm
runs ``rounds`` times, alternating, so a machine's load falls on both alike. Held-out evaluation
is cut to ``heldout_tasks`` tasks and run only before and after (it is off the budget's clock
either way); checkpoints only at the end.

Reported per arm: steps in the budget and steps per minute (median over rounds), the mean
per-step training and generation time, worker busy fraction; ``steps_ratio`` = now / before.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

from pydantic import Field

from tidal.bench.common import write_json
from tidal.bench.config import config_record, main, with_keys
from tidal.config import TidalConfig
from tidal.config_section import Section

READS = ("model", "trainer", "engine", "orchestrator", "env.name", "env.sandbox", "pretrain", "run")
"""What of the run config this benchmark uses (recorded in its JSON under "config")."""
BEFORE = {"trainer.share_prompts": False, "engine.share_prompts": False,
          "orchestrator.in_flight_updates": True, "env.sandbox.share_verdicts": False}
"""The settings that reproduce the loop before the speed work (its defaults then). Two changes
have no setting, so both arms have them and the ratio leaves out their gain: the bf16 attention
path "keys-first" (tidal.numerics.ops.ATTENTION_PATHS, where the probe picks it) and the workers
starting beside the evaluation before RL (orchestrator.loop.Run.run)."""


class BenchSection(Section):
    """Budget, rounds and the held-out set of the two arms; the rest is the run config."""

    budget_s: float = Field(150.0, gt=0)
    """RL wall-clock budget of each run, seconds (orchestrator.time_budget_s)."""
    rounds: int = Field(2, ge=1)
    """Runs per arm, alternating before / now."""
    heldout_tasks: int = Field(16, ge=1)
    """Held-out tasks of each run's before/after evaluation (speed is measured, not pass@1)."""


def run(bench: BenchSection, cfg: TidalConfig, json_path: str | None) -> int:
    result = run_rl_speed(bench, cfg)
    result["config"] = config_record(bench, cfg, READS)
    write_json(json_path, result)
    return 0


def run_rl_speed(bench: BenchSection, cfg: TidalConfig) -> dict:
    from tidal.bench.common import starting_model

    init = starting_model(cfg)
    common = {"orchestrator.time_budget_s": bench.budget_s, "orchestrator.steps": 100_000,
              "orchestrator.heldout_tasks": bench.heldout_tasks, "orchestrator.eval_every": 0,
              "orchestrator.checkpoint_every": 0}
    arms = {"before": with_keys(cfg, {**common, **BEFORE}), "now": with_keys(cfg, common)}
    runs: dict[str, list[dict]] = {name: [] for name in arms}
    with tempfile.TemporaryDirectory(prefix="tidal-bench-rl-") as tmp:
        for r in range(bench.rounds):
            for name, arm_cfg in arms.items():
                figures = _one_run(arm_cfg, Path(tmp) / f"{name}-{r}", init)
                print(f"{name} round {r}: {figures}", flush=True)
                runs[name].append(figures)
    out: dict = {name: _summary(rs) for name, rs in runs.items()}
    out["steps_ratio"] = out["now"]["steps_per_min"] / out["before"]["steps_per_min"]
    print(f"steps per minute: before {out['before']['steps_per_min']:.2f}, now "
          f"{out['now']['steps_per_min']:.2f}, ratio {out['steps_ratio']:.2f}", flush=True)
    out["runs"] = runs
    return out


def _one_run(cfg: TidalConfig, run_dir: Path, init) -> dict:
    from tidal.orchestrator.loop import run_rl
    from tidal.telemetry.metrics import read_metrics

    summary = run_rl(cfg, run_dir, init, progress=False)
    steps = [r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("kind") == "step"]
    mean = lambda key: statistics.fmean(s[key] for s in steps) if steps else 0.0
    return {"steps": summary.steps, "rl_wall_s": summary.rl_wall_s,
            "steps_per_min": 60 * summary.steps / summary.rl_wall_s,
            "train_s_per_step": mean("train_s"), "generate_s_per_step": mean("generate_s"),
            "worker_busy_fraction": summary.worker_busy_fraction,
            "heldout_pass1_after": summary.heldout_pass1_after}


def _summary(runs: list[dict]) -> dict:
    med = lambda key: statistics.median(r[key] for r in runs)
    return {key: med(key) for key in ("steps", "steps_per_min", "train_s_per_step",
                                      "generate_s_per_step", "worker_busy_fraction")}


if __name__ == "__main__":
    raise SystemExit(main(sys.modules[__name__], "rl"))
