"""The horizon benchmark's RL: one run of tidal's own loop per window and mode, and what it recorded.

    for each window W, for mode in bench.modes (summarize, summarize_check, truncate: MODES):
        the run config  = the benchmark's, with engine.max_seq_len = W, env.args = the window's
                          LedgerConfig, harness = the family's at W in this mode (harness_for,
                          budgets twice the expert's) with the harness keys the user gave on top,
                          and harness.summary_reward = "check" in summarize_check
        Run(config, runs_dir/W<W>-<mode>, the mid-trained model).run()     (orchestrator.loop)
            "before" evaluation: orchestrator.heldout_tasks held-out tasks (heldout_seed)
            RL until orchestrator.steps or orchestrator.time_budget_s, whichever comes first
            "after" evaluation on the same tasks
        the scripted expert on the same tasks through the same harness (evaluate.heldout_pass1)

The figures are read back from what each run wrote (its EvalRecords and step records in
metrics.jsonl, its summary.json), so the benchmark reports the runs, never a second computation.
Every mode starts from the same model with the same config but for ``harness.context_mode`` and
``harness.summary_reward``, so they get the same algorithm, the same step and wall-clock budget
and the same held-out tasks.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

from tidal.bench.config import with_keys
from tidal.config import TidalConfig
from tidal.families.ledger.sizing import LedgerWindow
from tidal.harness import HarnessConfig
from tidal.orchestrator.records import EvalRecord

MODES = {"summarize": ("summarize", "off"), "summarize_check": ("summarize", "check"),
         "truncate": ("truncate", "off")}
"""The arms a window may run (bench.modes) -> (harness.context_mode, harness.summary_reward):
self-summarization trained by the episode's reward only, the same with the dense summary reward
(the environment's check of each summary, tidal.harness.config), and the sliding window."""
BENCH_HARNESS_KEYS = ("context_window", "context_mode", "summary_reward")
"""Harness keys the benchmark sets itself (the window it compares, the arm it runs)."""


def harness_keys(cfg: TidalConfig) -> dict:
    """The harness keys the recipe or the command line gave (not the two the benchmark sets)."""
    return {k: getattr(cfg.harness, k) for k in cfg.harness.model_fields_set if k not in BENCH_HARNESS_KEYS}


def run_harness(given: dict) -> Callable[[HarnessConfig], HarnessConfig]:
    """The family's harness settings -> the run's: ``given`` (harness_keys) on top."""
    return lambda family: HarnessConfig.model_validate({**family.model_dump(), **given})


def run_config(cfg: TidalConfig, lw: LedgerWindow, mode: str,
               harness: Callable[[HarnessConfig], HarnessConfig]) -> TidalConfig:
    """The run config of window ``lw`` in ``mode`` (an arm of MODES)."""
    context_mode, summary_reward = MODES[mode]
    run_harness = harness(lw.harness(context_mode)).model_copy(update={"summary_reward": summary_reward})
    return with_keys(cfg, {"engine.max_seq_len": lw.window, "env.name": "ledger",
                           "env.args": lw.ledger.model_dump(mode="json"),
                           "harness": run_harness.model_dump(mode="json")})


def run_dir_of(runs_dir: Path, window: int, mode: str) -> Path:
    return runs_dir / f"W{window}-{mode}"


def run_mode(cfg: TidalConfig, run_dir: Path, model_dir: Path, progress: bool) -> dict:
    """One RL run (tidal's loop, orchestrator.loop.Run) in ``run_dir``: config.toml, the run's
    records and summary.json; then the expert on its held-out tasks. Returns mode_figures."""
    from tidal.bench.common import new_run_dir
    from tidal.orchestrator.loop import Run
    from tidal.orchestrator.run_output import write_summary

    run = Run(cfg, new_run_dir(cfg, run_dir), model_dir, progress)
    write_summary(run_dir, run.run())
    return mode_figures(run_dir, expert_pass1(run))


def expert_pass1(run) -> dict:
    """The slip-free scripted expert (tidal.families.ledger.demos.ExpertClient) on the run's held-out
    tasks, through the run's harness and environment, graded as the model is
    (``heldout_pass1``): the family's ceiling with summaries, and what a perfect reader keeps
    through a sliding window (by design nothing: the steps are read windows before f is written)."""
    from tidal.families.ledger.demos import ExpertClient
    from tidal.orchestrator.evaluate import heldout_pass1

    client = ExpertClient(run.eval_engine.tokenizer, random.Random(0), slip_rate=0.0)
    return heldout_pass1(run.eval_engine, run.env, run.heldout, run.cfg.harness, 1, client=client)


def mode_figures(run_dir: Path, expert: dict) -> dict:
    """What the run in ``run_dir`` recorded: its "before" and "after" evaluations and each step
    (metrics.jsonl), its steps and RL wall time (summary.json); and the expert's evaluation."""
    from tidal.telemetry.metrics import read_metrics

    records = read_metrics(run_dir / "metrics.jsonl")
    evals = {r["label"]: EvalRecord.from_json(r) for r in records if r["kind"] == "eval"}
    summary = json.loads((run_dir / "summary.json").read_text())
    curve = [{"step": r["step"], "wall_s": r["wall_s"], "success": r["pass_rate"],
              **{key: r.get(f"train/{key}") for key in CURVE_TRAIN_KEYS},
              **{key: r.get(key) for key in CURVE_STEP_KEYS}}
             for r in records if r["kind"] == "step"]
    return {"before": eval_figures(evals["before"]), "after": eval_figures(evals["after"]),
            "rl": {"run_dir": str(run_dir), "steps": summary["steps"], "wall_s": summary["rl_wall_s"],
                   "curve": curve},
            "expert": {"success": expert["pass1"], "effective_horizon": expert["episode"]["effective_horizon"],
                       "resets": expert["episode"]["resets"]}}


CURVE_TRAIN_KEYS = ("loss", "kl", "entropy", "grad_norm", "lr", "adv_abs_mean", "clip_frac")
"""The trainer's statistics each step of the curve keeps (its record's ``train/<key>``)."""
CURVE_STEP_KEYS = ("reward_mean", "reward_std", "generate_s", "train_s", "step_time_s")
"""The step record's own figures the curve keeps: the rollouts' rewards (reward_std 0 = no
signal) and where the step's time went."""


def eval_figures(ev: EvalRecord) -> dict:
    """An evaluation's success and harness statistics, as the JSON reports them."""
    e = ev.episode
    return {"success": ev.heldout_pass1, "effective_horizon": e.effective_horizon,
            "effective_horizon_min": ev.effective_horizon_min, "resets": e.resets,
            "summary_tokens_mean": e.summary_tokens_mean, "tool_errors": e.tool_errors,
            "episodes": sum(ev.reasons.values())}


def run_window(cfg: TidalConfig, lw: LedgerWindow, harness, model_dir: Path, runs_dir: Path,
               progress: bool, log, arms: list[str]) -> dict:
    """The runs of the ``arms`` (MODES' names) at window ``lw``: the JSON's ``by_window`` entry."""
    modes, configs = {}, {mode: run_config(cfg, lw, mode, harness) for mode in arms}
    for mode in arms:
        run_dir = run_dir_of(runs_dir, lw.window, mode)
        modes[mode] = run_mode(configs[mode], run_dir, model_dir, progress)
        m = modes[mode]
        log(f"W={lw.window} {mode}: before RL {m['before']['success']:.2f}, after "
            f"{m['rl']['steps']} RL steps {m['after']['success']:.2f}, expert {m['expert']['success']:.2f}"
            f" ({run_dir})")
    summarizing = next(mode for mode in arms if MODES[mode][0] == "summarize")
    out = {"window": lw.window, "num_files": lw.ledger.num_files,
           "expert_effective_horizon": modes[summarizing]["expert"]["effective_horizon"],
           "expert_resets": modes[summarizing]["expert"]["resets"],
           "expert_success": {mode: modes[mode]["expert"]["success"] for mode in arms},
           "harness": {mode: configs[mode].harness.model_dump(mode="json") for mode in arms}}
    for mode in arms:
        out |= {f"before_rl_{mode}": modes[mode]["before"], f"rl_{mode}": modes[mode]["rl"],
                f"after_rl_{mode}": modes[mode]["after"]}
    return out
