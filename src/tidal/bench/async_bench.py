"""Asynchronous vs synchronous RL on the same task, machine and wall-clock budget.

    tidal bench async --json docs/results/async-intel-xeon-2core.json      # 33 min on 2 cores
    tidal bench async --quick --json async-quick.json                       # 1 seed, short budgets
    tidal bench async --bench.runs 5 --orchestrator.time_budget_s 300

For each seed (``bench.runs`` of them, run.seed, run.seed + 1, ...), from the same mid-trained
model (the default recipe's, cached; or model.init_from):

    sync   orchestrator.max_staleness = 0: generation and training alternate
    async  orchestrator.max_staleness = bench.max_staleness: workers generate step s + 1 while
           the trainer trains step s

each one run of tidal's own loop (``orchestrator.loop.Run``, async_runs) with the trainer and the
rollout worker pinned to separate cores in both modes (run.trainer_cpus = [0],
run.worker_cpus = [1]: the disaggregated layout of a real deployment, on 2 cores; Ray backend).
Then one elastic run: the async config with two pools, "a" (1 worker from 0 s, 0 from 2/3 of the
budget) and "b" (0 workers, 1 from 1/3 of the budget): one joins mid-run, the other leaves.

Held-out pass@1 over time: every ``bench.eval_every`` steps the run saves a checkpoint
(orchestrator.checkpoint_every), and after the run each is evaluated on the run's held-out
tasks (orchestrator.heldout_tasks, default 64 x orchestrator.eval_samples_per_task 2 samples),
exactly as the loop's own evaluation does (same function, sampler and seed; the loop's "before"
and "after" evaluations are the curve's ends). So no evaluation is inside the RL wall time at
all, on either side. In-loop evaluations (orchestrator.eval_every > 0) are timed and taken out
of RL time instead (the same rule on both sides), but they favour async: its worker keeps
generating during an evaluation while the synchronous worker waits for the next step, so the
default keeps them off the clock.

Time to target = the RL time at which the curve first reaches the target (interpolated between
checkpoints). The target (``bench.target_pass1``, unset = per seed: before + target_fraction x
the smaller of the two modes' best gains, so both reach it) and the speedup per seed = sync's
time / async's; the JSON's headline figures are medians over the seeds, every run listed.

Why this configuration (DEFAULTS): the async ceiling is (gen + train) / max(gen, train) per
step, so generation per step on the worker's core should take about as long as (slightly longer
than) the trainer's step on its core. The trainer's time grows with the episodes, the batched
decode's more slowly, so 16 tasks x 8 samples = 128 episodes brings the two closest on 2 cores.
One rollout worker with one thread: a second one on the same core only splits it. The measured
per-step generation and training times of every run are in the JSON (generate_s_per_step,
train_s_per_step, and the ceiling they give). orchestrator.in_flight_updates is off: with it on,
the async worker loads each new version in the middle of its 128 episodes and recomputes their
KV caches (engine.recompute_kv_on_reload), which slows its generation; without it a worker keeps
one version per assignment, every trajectory is exactly one version stale, and the synchronous
side is unchanged (no version is published while it generates). The timings behind these
choices: docs/fleet.md, "Asynchronous vs synchronous, measured".

Rollout-worker utilisation = busy (generating + grading) over worker-seconds of membership
(summary.json's worker_busy_fraction). The simulator (tidal.fleet.simulate) is calibrated on the
first seed's synchronous run (tidal.fleet.calibrate) and predicts every other run (the other
seeds, both modes, and the elastic run) from its config and step count: sim_error.* is the
median relative error over those predicted runs, out of sample. Lost trajectories: planned
trajectories of a trained step neither trained nor dropped as stale; duplicated: trained beyond
the plan (from the step records), beside summary.json's fleet.duplicates (results dropped
because their assignment was already back).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from pydantic import Field

from tidal.bench.common import write_json
from tidal.bench.config import SEED_KEY, config_record, main, run_seed, with_keys
from tidal.config import ConfigError, TidalConfig
from tidal.config_section import Section

READS = ("model", "engine", "env", "harness", "trainer", "pretrain", "orchestrator", "sync", "run",
         SEED_KEY)

DEFAULTS = {
    "orchestrator.backend": "ray", "orchestrator.num_workers": 1, "orchestrator.cpus_per_worker": 1.0,
    "orchestrator.ray_num_cpus": 2, "run.trainer_cpus": [0], "run.worker_cpus": [1],
    "run.trainer_threads": 1, "run.worker_threads": 1,
    "orchestrator.tasks_per_step": 16, "orchestrator.group_size": 8,
    "orchestrator.time_budget_s": 210.0, "orchestrator.steps": 10_000,
    "orchestrator.heldout_tasks": 64, "orchestrator.eval_samples_per_task": 2,
    "orchestrator.eval_every": 0, "env.integrity.eval_canaries": 0,
    "orchestrator.in_flight_updates": False,
}
"""The run config both modes share (see the module docstring for why)."""

QUICK = {"bench.runs": 1, "orchestrator.time_budget_s": 60.0, "orchestrator.heldout_tasks": 16}
"""--quick: one seed, a minute per run, 16 held-out tasks."""

class BenchSection(Section):
    """What the benchmark compares and how it measures: the number of seeds, the asynchronous
    side's staleness bound, how often a checkpoint is evaluated off the clock, the target, and
    whether to add the elastic run and the simulator. Everything else is the run config (its
    defaults here: DEFAULTS), shared by both modes."""

    runs: int = Field(3, ge=1)
    """Seeds per mode (run.seed, run.seed + 1, ...); the headline figures are their medians."""
    max_staleness: int = Field(1, ge=1)
    """orchestrator.max_staleness of the asynchronous side (the synchronous side has 0)."""
    eval_every: int = Field(2, ge=1)
    """Save a checkpoint every this many steps (orchestrator.checkpoint_every); each is
    evaluated on the held-out tasks after the run, off the RL clock."""
    target_pass1: float | None = Field(None, ge=0, le=1)
    """Held-out pass@1 both modes race to; unset = per seed, before + target_fraction x the
    smaller of the two modes' best gains."""
    target_fraction: float = Field(0.5, gt=0, le=1)
    """The fraction of the smaller best gain the default target asks for."""
    elastic: bool = True
    """Add the elastic run (a pool joins at 1/3 of the budget, another leaves at 2/3)."""
    simulate: bool = True
    """Calibrate the simulator on the first synchronous run and predict the others."""
    runs_dir: str | None = None
    """Folder of the runs (seed<N>-sync/, seed<N>-async/, elastic/); unset = runs/async-<date-time>."""


def run(bench: BenchSection, cfg: TidalConfig, json_path: str | None) -> int:
    run_async_bench(bench, cfg, json_path)
    return 0


def mode_config(bench: BenchSection, cfg: TidalConfig, mode: str, seed: int) -> TidalConfig:
    """The run config of one side: the shared config with its staleness bound, seed and the
    checkpoints the curve is measured on."""
    staleness = 0 if mode == "sync" else bench.max_staleness
    return with_keys(cfg, {"orchestrator.max_staleness": staleness, "run.seed": seed,
                           "orchestrator.checkpoint_every": bench.eval_every})


def elastic_config(bench: BenchSection, cfg: TidalConfig, seed: int) -> TidalConfig:
    """The async config with two pools: "a" from 0 s until 2/3 of the budget, "b" from 1/3."""
    budget = cfg.orchestrator.time_budget_s
    pools = [{"name": "a", "workers": 1, "schedule": [{"at_s": 0.0, "workers": 1},
                                                      {"at_s": round(2 * budget / 3, 1), "workers": 0}]},
             {"name": "b", "workers": 1, "schedule": [{"at_s": 0.0, "workers": 0},
                                                      {"at_s": round(budget / 3, 1), "workers": 1}]}]
    return with_keys(mode_config(bench, cfg, "async", seed), {"fleet.pools": pools})


def check(cfg: TidalConfig) -> None:
    """Settings the comparison cannot honour: one clear error each."""
    if cfg.fleet.pools:
        raise ConfigError("tidal bench async sets the fleet itself (one pool; the elastic run's two): "
                          "remove fleet.pools")
    have = os.sched_getaffinity(0)
    for key in ("trainer_cpus", "worker_cpus"):
        missing = set(getattr(cfg.run, key)) - have
        if missing:
            raise ConfigError(f"run.{key}: CPUs {sorted(missing)} are not available to this process "
                              f"(it may run on {sorted(have)})")


def run_async_bench(bench: BenchSection, cfg: TidalConfig, json_path: str | Path | None = None,
                    progress: bool = True) -> dict:
    """Both modes per seed, the elastic run, the simulator; the result dict (and ``json_path``)."""
    from tidal.bench.async_report import print_table, summarize
    from tidal.bench.async_runs import evaluate_checkpoints, run_figures, run_one

    check(cfg)
    t0 = time.perf_counter()
    log = (lambda msg: print(f"[{time.perf_counter() - t0:6.0f}s] {msg}", flush=True)) if progress else (lambda m: None)
    cpus = sorted(os.sched_getaffinity(0))
    model_dir = initial_model(cfg, progress)
    runs_dir = Path(bench.runs_dir or f"runs/async-{time.strftime('%Y%m%d-%H%M%S')}")
    configs: dict[str, TidalConfig] = {}
    figures: dict[str, dict] = {}

    def one(name: str, run_cfg: TidalConfig) -> None:
        run_dir = runs_dir / name
        run_one(run_cfg, run_dir, model_dir, False)
        points = evaluate_checkpoints(run_cfg, run_dir, cpus)
        figures[name], configs[name] = run_figures(run_dir, points), run_cfg
        f = figures[name]
        log(f"{name}: {f['steps']} steps in {f['rl_wall_s']:.0f} s, pass@1 {f['before_pass1']:.3f} -> "
            f"{f['final_pass1']:.3f}, utilisation {f['worker_utilisation']:.2f}, step {f['step_time_s']:.1f} s "
            f"(gen {f['generate_s_median']:.1f} s, train {f['train_s_median']:.1f} s)")

    base = run_seed(cfg)
    for i in range(bench.runs):
        for mode in ("sync", "async"):
            one(f"seed{base + i}-{mode}", mode_config(bench, cfg, mode, base + i))
    if bench.elastic:
        one("elastic", elastic_config(bench, cfg, base))
    result = summarize(bench, cfg, figures, configs, runs_dir, model_dir)
    result["wall_s"] = time.perf_counter() - t0
    result["config"] = config_record(bench, cfg, READS)
    print_table(result)
    if json_path:
        write_json(json_path, result)
    return result


def initial_model(cfg: TidalConfig, progress: bool) -> Path:
    """model.init_from, or the mid-trained model of this config (cached_pretrained: mid-trains
    once, the first time)."""
    from tidal.bench.common import starting_model

    return starting_model(cfg, progress)


if __name__ == "__main__":
    raise SystemExit(main(sys.modules[__name__], "async"))
