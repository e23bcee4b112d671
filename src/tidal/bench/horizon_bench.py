"""Long-horizon success: RL with self-summarization vs the same RL budget with a sliding window.

    tidal bench horizon --json horizon.json                       # ~28 min on 2 CPU cores
    tidal bench horizon --quick --json horizon.json               # smaller budgets (QUICK)
    tidal bench horizon --bench.windows 384 --orchestrator.time_budget_s 600 --trainer.lr 3e-4
    python -m tidal.bench.horizon_bench --bench.windows 384       # the same as tidal bench horizon

On the "ledger" family (tidal.families.ledger: the steps of f are read early, in files many
context windows before f is written), at each context window W:

    drill + mid-train once (cached; horizon_midtrain) ──> model before RL ──┬─> run_rl, summarize
                                                                            ├─> run_rl, summarize_check
                                                                            └─> run_rl, truncate

(the arms of ``--bench.modes``, default summarize and truncate; summarize_check is summarize
with the dense summary reward, ``harness.summary_reward = "check"``: each summary's own check
against the facts its context showed, credited to that summary's segment)

Each arm is one run of tidal's own RL loop (``orchestrator.loop.Run``; horizon_runs): its
"before" and "after" held-out evaluations give before_rl and summarize / truncate, and the
scripted expert is graded on the same held-out tasks through the same harness. The peer is
plain truncation: the harness's sliding window (keep the head and the newest turns) with the same
model, the same mid-training, the same RL algorithm and the same step and wall-clock budget.

The run config is tidal's (``[RECIPE.toml]`` and ``--SECTION.KEY`` overrides, see
tidal.bench.config), with the benchmark's defaults beneath it (``DEFAULTS``): the RL loop
synchronous and in process (``orchestrator.backend = "local"``, one worker,
``max_staleness = 0``: on 2 cores more workers only compete with the trainer, and both modes must
see exactly the same kind of budget), one held-out sample per task, "fast" numerics (on 2 CPU
cores the deterministic trainer forward makes an RL step much slower, and this benchmark
measures what RL learns in a wall-clock budget), RL at lr 3e-4 after 2 warm-up steps, then
constant (Adam moves each weight by about lr a step, so a few steps at a lower rate move the
policy too little; docs/environments.md). Per window the benchmark sets ``engine.max_seq_len``,
``env.args`` (the window's LedgerConfig: its files sized by ``bench.horizon``; the other
ledger settings are the user's ``env.args``) and ``harness`` (the family's settings, budgets
twice what the expert needs; harness keys given apply on top, all but context_window and
context_mode). Each run's folder holds its full config.toml.

Mid-training is next-token prediction of the scripted expert's turns and summaries in its
episodes, in the harness's own token format (tidal.families.ledger.demos): first a drill at a
small window (one file per context, so a summary to copy every ~200 tokens), then the compared
windows: without the drill the model learns to carry each step's operator but not its constant
(docs/environments.md), and what it still gets wrong after the drill (two steps with the same
operator swapped, a step never added) is what RL on the episode's reward can fix.

Figures: success = held-out pass@1, the fraction of held-out episodes whose f passes every
hidden test (``Trajectory.solved``; one sample per task at the RL sampler); the reward RL sees
adds partial credit (< 1) for each step carried right, so GRPO has a signal before the first
full success. effective_horizon = the harness's transcript tokens / W of the episodes (mean and
min; the runs' EvalRecords), for the model and for the scripted expert. Budgets are wall-clock,
so on a busy machine fewer RL steps fit; the JSON records the steps each run made.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Literal

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from pydantic import Field  # noqa: E402

from tidal.bench.common import write_json  # noqa: E402
from tidal.bench.config import (  # noqa: E402
    SEED_KEY,
    THREADS_KEY,
    IntList,
    StrList,
    config_record,
    lookup,
    main,
    with_keys,
    with_preset,
)
from tidal.bench.horizon_runs import MODES  # noqa: E402
from tidal.config import ConfigError, TidalConfig  # noqa: E402
from tidal.families.ledger.sizing import HORIZON  # noqa: E402
from tidal.model.presets import PRESETS  # noqa: E402
from tidal.config_section import Section  # noqa: E402

READS = ("model", "engine", "env", "harness", "trainer", "pretrain", "orchestrator", "sync",
         SEED_KEY, THREADS_KEY)
"""The run config's sections the runs use (recorded in the JSON under "config")."""

DEFAULTS = {
    "env.name": "ledger", "env.args.summary_slip_rate": 0.0,
    "engine.numerics": "fast", "engine.temperature": 1.0, "engine.max_new_tokens": 96,
    "trainer.lr": 3e-4, "trainer.warmup_steps": 2, "trainer.lr_schedule": "constant",
    "trainer.micro_batch_size": 16, "harness.summary_reward_coef": 2.0,
    "orchestrator.backend": "local", "orchestrator.num_workers": 1, "orchestrator.max_staleness": 0,
    "orchestrator.tasks_per_step": 4, "orchestrator.group_size": 4,
    "orchestrator.steps": 200, "orchestrator.time_budget_s": 180.0,
    "orchestrator.heldout_tasks": 32, "orchestrator.eval_samples_per_task": 1,
    "orchestrator.eval_every": 0, "orchestrator.checkpoint_every": 0,
    "pretrain.max_steps": 600, "pretrain.time_budget_s": 1800.0, "pretrain.lr": 3e-3,
    "pretrain.batch_size": 16, "pretrain.warmup_steps": 30, "pretrain.log_every": 50,
    "sync.transport": "filesystem",
    THREADS_KEY: 2,
}
"""The benchmark's settings of the run config, beneath the recipe and the command line (see the
module docstring): RL steps of 4 tasks x 4 episodes for 180 s at lr 3e-4 (the recipe's) after
2 warm-up steps, held there (a wall-clock budget of ~10 steps ends long before a decay planned
over orchestrator.steps), the dense summary reward (in the summarize_check arm) weighted 2 against
the episode's group-normalised advantage, 32 held-out tasks; mid-training on
the compared windows for 600 steps at lr 3e-3 (cosine to 10%; the 1800 s budget is a safety net,
so the model before RL is the same on a slower machine, only later); perfect expert
summaries in the demonstrations (env.args.summary_slip_rate 0); 2 torch threads for the
in-process worker's engine, as for the trainer; weights handed to the in-process worker through
the filesystem."""

QUICK = {"bench.demo_episodes": 2000, "bench.drill_steps": 300, "pretrain.max_steps": 150,
         "orchestrator.time_budget_s": 45.0, "orchestrator.heldout_tasks": 16}
"""--quick: shorter budgets (figures from these are labelled "quick" in the JSON)."""

BUDGET_KEYS = ("bench.demo_episodes", "bench.drill_steps", "bench.drill_s", "pretrain.max_steps",
               "pretrain.time_budget_s", "orchestrator.time_budget_s", "orchestrator.steps",
               "orchestrator.heldout_tasks", "model.init_from")
"""What decides how much the figures are worth: "full" only with the defaults of all of them."""


class BenchSection(Section):
    """What the benchmark compares and how it mid-trains. Everything else is the run config: the
    RL algorithm and budgets ([trainer], [orchestrator]), sampling ([engine]), mid-training
    ([pretrain]; model.init_from: start RL from that model instead, no mid-training), the
    ledger settings (env.args, all but num_files), the seed and threads."""

    windows: IntList = [384, 512]
    """Context windows compared, tokens (each >= 320: the head, a summary and a turn must fit)."""
    modes: StrList = ["summarize", "truncate"]
    """The arms run at each window, in order (at least one that summarizes): "summarize" (RL on
    the episode's reward), "summarize_check" (the same plus the dense summary reward,
    harness.summary_reward = "check", weighted by harness.summary_reward_coef), "truncate" (the
    sliding window, the peer)."""
    horizon: float = Field(HORIZON, gt=1.0)
    """Files per task are chosen so the expert's episode is at least this many windows long."""
    preset: Literal[tuple(PRESETS)] = "tiny"
    """Named model size (tidal.model.presets) [model] starts from; model keys given apply on top.
    model.max_position_embeddings is the largest window unless given."""
    demo_episodes: int = Field(4000, ge=2)
    """Expert episodes rendered for mid-training, spread over the windows (half as many again for
    the drill)."""
    drill_window: int = Field(272, ge=272)
    """Mid-training starts with demonstrations at this small window, about one file per context,
    so every ~200 tokens end in a summary that copies the steps' constants. On the real windows
    a summary comes every 400-500 tokens, and there a tiny model learned each step's operator
    but not its digit (docs/environments.md); the short contexts make the copy signal 2-3x
    denser per token.
    (At 272 a file, the submit turn and a summary fit in one context; at 256 they do not, and
    the expert's episode never ends.)"""
    drill_files: int = Field(12, ge=2)
    """Files per drill task (its episodes are short: only the copying is drilled)."""
    drill_steps: int = Field(1200, ge=0)
    """Optimizer steps of the drill stage (0 = no drill); the compared windows' stage has
    pretrain.max_steps. Both stages end on steps, so the model RL starts from does not depend
    on the machine's speed (with a time budget a stage it did: docs/environments.md)."""
    drill_s: float = Field(1800.0, ge=0)
    """Wall-clock safety net of the drill stage, seconds (0 = no drill; a stage cut by its budget
    anneals against the clock and is not reproducible, and says so); the compared windows'
    stage has pretrain.time_budget_s."""
    runs_dir: str | None = None
    """Folder of the RL runs, one per window and mode (W384-summarize/, ...: config.toml,
    metrics.jsonl, summary.json, the final checkpoint); unset = runs/horizon-<date-time>."""


def run(bench: BenchSection, cfg: TidalConfig, json_path: str | None) -> int:
    run_horizon_bench(bench, cfg, json_path)
    return 0


def bench_config(bench: BenchSection, cfg: TidalConfig) -> TidalConfig:
    """The run config every run starts from: the preset's model (max_position_embeddings the
    largest window unless given), the pretrain sequence length the largest window."""
    if cfg.env.name != "ledger":
        raise ConfigError(f"tidal bench horizon runs the ledger family: env.name must be 'ledger', "
                          f"not {cfg.env.name!r}")
    if "num_files" in cfg.env.args:
        raise ConfigError("env.args.num_files is chosen per window by --bench.horizon (the "
                          "expert's episode length in windows); remove it")
    unknown = [m for m in bench.modes if m not in MODES]
    if unknown:
        raise ConfigError(f"bench.modes: unknown arm {unknown[0]!r}; choose from {', '.join(MODES)}")
    if not any(MODES[m][0] == "summarize" for m in bench.modes) or len(set(bench.modes)) < len(bench.modes):
        raise ConfigError(f"bench.modes: give each arm once, at least one of them summarize or "
                          f"summarize_check (got {bench.modes})")
    if min(bench.windows) < 320:
        raise ConfigError(f"bench.windows: each must be >= 320 (got {bench.windows})")
    longest = max(bench.windows)
    keys = {"pretrain.seq_len": longest}
    if "max_position_embeddings" not in cfg.model.model_fields_set:
        keys["model.max_position_embeddings"] = longest
    return with_keys(with_preset(cfg, bench.preset), keys)


def run_horizon_bench(bench: BenchSection, cfg: TidalConfig, json_path: str | Path | None = None,
                      progress: bool = True) -> dict:
    """Mid-train (or reuse), run both modes at each window, print the table; the result dict
    (and ``json_path``)."""
    from tidal.bench.horizon_midtrain import midtrain
    from tidal.bench.horizon_runs import harness_keys, run_harness, run_window
    from tidal.env.registry import validate_args
    from tidal.families.ledger.config import LedgerConfig
    from tidal.families.ledger.sizing import ledger_window

    t0 = time.perf_counter()
    log = (lambda msg: print(f"[{time.perf_counter() - t0:6.0f}s] {msg}", flush=True)) if progress else (lambda msg: None)
    given_harness = harness_keys(cfg)
    harness = run_harness(given_harness)
    cfg = bench_config(bench, cfg)
    base: LedgerConfig = validate_args("ledger", cfg.env.args)
    windows = [ledger_window(w, bench.horizon, base) for w in bench.windows]
    if cfg.model.init_from:
        model_dir, mid = Path(cfg.model.init_from), {"given": cfg.model.init_from}
    else:
        model_dir, mid = midtrain(bench, cfg, windows, harness, progress)
    log(f"mid-trained model {model_dir}: {mid}")
    runs_dir = Path(bench.runs_dir or f"runs/horizon-{time.strftime('%Y%m%d-%H%M%S')}")
    by_window = [run_window(cfg, lw, harness, model_dir, runs_dir, progress, log, bench.modes)
                 for lw in windows]
    result = summarize_result(bench, cfg, by_window, mid, runs_dir, time.perf_counter() - t0)
    result["config"]["harness"] = {"given": given_harness}  # each run's: by_window[W]["harness"]
    print_table(result)
    if json_path:
        write_json(json_path, result)
    return result


def summarize_result(bench: BenchSection, cfg: TidalConfig, windows: list[dict], mid: dict,
                     runs_dir: Path, wall_s: float) -> dict:
    """The JSON: headline keys are means over the windows (one per mode run); ``by_window`` holds
    each window; ``rl_gain_points`` is after minus before RL, per summarizing mode and window."""

    def mean(key: str, field: str = "success") -> float:
        return statistics.mean(w[key][field] for w in windows)

    summarizing = [m for m in bench.modes if MODES[m][0] == "summarize"]
    first = summarizing[0]
    out = {mode: {"success": mean(f"after_rl_{mode}"),
                  "effective_horizon": mean(f"after_rl_{mode}", "effective_horizon")}
           for mode in bench.modes}
    out["before_rl"] = {"success": mean(f"before_rl_{first}")}
    if "truncate" in bench.modes:
        out["before_rl"]["truncate_success"] = mean("before_rl_truncate")
        out["summarize_minus_truncate_points"] = 100 * (out[first]["success"] - out["truncate"]["success"])
    out["rl_gain_points"] = {mode: {str(w["window"]): 100 * (w[f"after_rl_{mode}"]["success"]
                                                             - w[f"before_rl_{mode}"]["success"])
                                    for w in windows} for mode in summarizing}
    return out | {
        "effective_horizon": min(min(w[f"after_rl_{first}"]["effective_horizon"],
                                     w["expert_effective_horizon"]) for w in windows),
        "targets": {"effective_horizon": 10.0, "summarize_minus_truncate_points": 25.0,
                    "rl_gain_points": 15.0},
        "modes": bench.modes,
        "windows": bench.windows,
        "by_window": {str(w["window"]): w for w in windows},
        "midtrain": mid,
        "budget": budget_label(bench, cfg),
        "runs_dir": str(runs_dir),
        "config": config_record(bench, cfg, READS),
        "wall_s": wall_s,
        "torch": torch.__version__,
    }


def budget_label(bench: BenchSection, cfg: TidalConfig) -> str:
    """"full" when every budget (BUDGET_KEYS) is the benchmark's default, "quick" when they are
    --quick's, else "custom" (the JSON's config says which)."""

    def value(key: str):
        return getattr(bench, key.removeprefix("bench.")) if key.startswith("bench.") else lookup(cfg, key)

    def default(key: str):
        if key.startswith("bench."):
            return BenchSection.model_fields[key.removeprefix("bench.")].default
        return DEFAULTS.get(key, lookup(TidalConfig(), key))

    ran = {k: value(k) for k in BUDGET_KEYS}
    full = {k: default(k) for k in BUDGET_KEYS}
    if ran == full:
        return "full"
    return "quick" if ran == {**full, **QUICK} else "custom"


def print_table(r: dict) -> None:
    modes = r["modes"]
    print(f"\nledger family, success on held-out tasks ({r['budget']} budgets; runs in {r['runs_dir']})")
    print(f"{'window':>7} {'files':>6} {'before RL':>10} " + " ".join(f"{m:>16}" for m in modes)
          + f" {'horizon':>8}  RL steps")
    for key, w in r["by_window"].items():
        first = next(m for m in modes if m != "truncate")
        print(f"{key:>7} {w['num_files']:>6} {w[f'before_rl_{first}']['success']:>10.2f} "
              + " ".join(f"{w[f'after_rl_{m}']['success']:>16.2f}" for m in modes)
              + f" {w[f'after_rl_{first}']['effective_horizon']:>8.1f}  "
              + "/".join(str(w[f"rl_{m}"]["steps"]) for m in modes))
    gains = "; ".join(f"{m} " + ", ".join(f"{g:+.1f}" for g in by_w.values())
                      for m, by_w in r["rl_gain_points"].items())
    print(f"RL gain, points per window: {gains} (target >= +15 at each window)")
    if "summarize_minus_truncate_points" in r:
        print(f"summarize minus truncate {r['summarize_minus_truncate_points']:.1f} points "
              f"(target >= 25); effective horizon (min) {r['effective_horizon']:.1f}x the window "
              f"(target >= 10x)")


if __name__ == "__main__":
    raise SystemExit(main(sys.modules[__name__], "horizon"))
