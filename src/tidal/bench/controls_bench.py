"""The loss controls as arms: the default recipe's RL with each control on, on two families.

    tidal bench controls --json controls.json              # funcs and fixit, 5 arms, 120 steps each
    tidal bench controls --bench.families fixit --bench.arms defaults,kl_initial --bench.steps 60

Each arm is tidal's own RL loop (``orchestrator.loop.Run``, as ``tidal train`` runs it) from the
family's cached mid-training (made first if missing), with the same seed, tasks, held-out set and
number of RL steps; only the arm's keys (``ARMS``) differ. Every arm runs the same steps rather
than the same seconds, so a control that costs time (the KL to the initial model's extra forward)
is judged on what it learns, and its cost is reported beside it (seconds per step). The guard is
off (``orchestrator.guard.policy = "off"``), so a collapse shows in the curve instead of being
undone, except in the ``guarded`` arm, whose restores are listed beside its figures. Run-config
keys given on the command line apply to every arm; an arm's own keys go on top.

Reported per family and arm: held-out pass@1 before RL, at every ``eval_every`` steps and after
the last step; the gain (final minus before), the best evaluation and its step, the largest drop
below the best so far (the issue's "never more than 5 points" figure), seconds per RL step, and
the last and lowest training entropy. One run per arm and family is one sample: with 256 held-out
tasks x 2 samples a difference of a few points between arms is within the noise of one run
(``bench.rounds`` repeats every arm, alternating, with the seed ``run.seed + round``).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from pydantic import Field

from tidal.bench.common import new_run_dir, write_json
from tidal.bench.config import SEED_KEY, StrList, config_record, main, run_seed, with_keys
from tidal.config import ConfigError, TidalConfig
from tidal.config_section import Section

READS = ("model", "trainer", "engine", "orchestrator", "env.name", "pretrain", "run")
"""What of the run config this benchmark uses (recorded in its JSON under "config")."""

ARMS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "constant_lr": {"trainer.lr_schedule": "constant"},
    "kl_initial": {"trainer.kl_coef": 0.04, "trainer.kl_reference": "initial"},
    "kl_behaviour": {"trainer.kl_coef": 0.04, "trainer.kl_reference": "behaviour"},
    "entropy_bonus": {"trainer.entropy_coef": 0.01, "trainer.entropy_floor": 0.1},
    "dual_clip": {"trainer.dual_clip": 3.0},
    "guarded": {"orchestrator.guard.policy": "restore"},
}
"""Each arm's keys on top of the run config. defaults: the recipe as it is (cosine schedule, no
control); constant_lr: no decay (the run issue 17 reports collapsing had a constant rate);
kl_initial / kl_behaviour: the k3 penalty at GRPO's weight 0.04 (DeepSeekMath) to a frozen copy
of the model RL began from / to the sampling policy; entropy_bonus: 0.01 x entropy wherever a
micro-batch's entropy is below 0.1 nats a token (the guard's entropy floor); dual_clip: 3 (the
dual-clip PPO paper's value); guarded: the defaults with the guard on, as `tidal train` runs
(every other arm has it off), to see whether it catches and undoes what the defaults fall into."""


class BenchSection(Section):
    """Families, arms, steps and evaluations of the comparison; the rest is the run config."""

    families: StrList = ["funcs", "fixit"]
    """Environment families (env.name) the arms run on, each from its own mid-training."""
    arms: StrList = ["defaults", "constant_lr", "kl_initial", "entropy_bonus", "dual_clip"]
    """The arms, in order, from ARMS (defaults, constant_lr, kl_initial, kl_behaviour,
    entropy_bonus, dual_clip, guarded)."""
    steps: int = Field(120, ge=1)
    """RL steps of every run (orchestrator.steps; the schedule is planned over them). The
    wall-clock budget is set far beyond them so that every arm makes all of its steps."""
    eval_every: int = Field(20, ge=1)
    """Held-out evaluation every this many steps (orchestrator.eval_every)."""
    rounds: int = Field(1, ge=1)
    """Runs per arm and family, alternating arms; round r uses the seed run.seed + r."""
    runs_dir: str | None = None
    """Keep the runs here (FAMILY/ARM-ROUND/: config.toml, metrics.jsonl, summary.json, the
    final checkpoint; `tidal report` reads each); unset = a temporary folder, removed after."""


def run(bench: BenchSection, cfg: TidalConfig, json_path: str | None) -> int:
    result = run_controls(bench, cfg)
    result["config"] = config_record(bench, cfg, READS)
    write_json(json_path, result)
    return 0


def run_controls(bench: BenchSection, cfg: TidalConfig) -> dict:
    """Every arm on every family; the result dict (``by_family[family][arm]``: the figures,
    medians over rounds where a figure has several, and each run's under ``runs``)."""
    unknown = [a for a in bench.arms if a not in ARMS]
    if unknown or len(set(bench.arms)) < len(bench.arms):
        raise ConfigError(f"bench.arms: give each arm once, from {', '.join(ARMS)} (got {bench.arms})")
    common = {"orchestrator.steps": bench.steps, "orchestrator.time_budget_s": 1e9,
              "orchestrator.eval_every": bench.eval_every, "orchestrator.checkpoint_every": 0,
              "orchestrator.guard.policy": "off"}
    out: dict[str, Any] = {"by_family": {}}
    with tempfile.TemporaryDirectory(prefix="tidal-bench-controls-") as tmp:
        root = Path(bench.runs_dir or tmp)
        for family in bench.families:
            out["by_family"][family] = _family(bench, with_keys(cfg, {"env.name": family}), common,
                                               root / family)
    _print_table(out["by_family"])
    return out


def _family(bench: BenchSection, cfg: TidalConfig, common: dict, root: Path) -> dict:
    from tidal.bench.common import starting_model

    init = starting_model(cfg)
    runs: dict[str, list[dict]] = {arm: [] for arm in bench.arms}
    for r in range(bench.rounds):
        for arm in bench.arms:
            arm_cfg = with_keys(cfg, {**common, SEED_KEY: run_seed(cfg) + r, **ARMS[arm]})
            figures = _one_run(arm_cfg, root / f"{arm}-{r}", init)
            print(f"{cfg.env.name} {arm} round {r}: {figures}", flush=True)
            runs[arm].append(figures)
    return {arm: {**_median(rs), "keys": ARMS[arm], "runs": rs} for arm, rs in runs.items()}


def _one_run(cfg: TidalConfig, run_dir: Path, init) -> dict:
    """One RL run in ``run_dir`` (its config.toml, metrics and summary, as `tidal train`
    writes them, so `tidal report` reads it); its figures."""
    from tidal.orchestrator.loop import run_rl
    from tidal.telemetry.metrics import read_metrics

    summary = run_rl(cfg, new_run_dir(cfg, run_dir), init, progress=False)
    rows = read_metrics(run_dir / "metrics.jsonl")
    evals = [(r["step"], r["heldout_pass1"]) for r in rows if r.get("kind") == "eval"]
    return {**curve_figures(evals), **guard_figures(summary.guard), **entropy_figures(rows),
            "steps": summary.steps, "s_per_step": summary.rl_wall_s / max(summary.steps, 1)}


def entropy_figures(rows: list[dict]) -> dict:
    """The train entropy of the last step that trained and its minimum over the run. A step
    that trained nothing (the one that restored a checkpoint) has no ``train/`` figures."""
    entropy = [r["train/entropy"] for r in rows if r.get("kind") == "step" and "train/entropy" in r]
    return {"entropy_last": entropy[-1] if entropy else None,
            "entropy_min": min(entropy) if entropy else None}


def guard_figures(guard: dict | None) -> dict:
    """A run's guard events (step, detector, action, restored step) and its restores, from the
    summary's ``guard`` (None: the guard was off)."""
    events = (guard or {}).get("events", [])
    return {"guard_events": [{k: e[k] for k in ("step", "detector", "action", "restored_step")}
                             for e in events],
            "restores": sum(e["action"] == "restore" for e in events)}


def curve_figures(evals: list[tuple[int, float]]) -> dict:
    """Held-out figures of one run from its evaluations [(step, pass@1), ...] in order, the
    first before RL: before, final, gain (points), best and its step, the largest drop below the
    best so far (points), and the curve itself."""
    best, best_step, drop = evals[0][1], evals[0][0], 0.0
    for step, p in evals:
        if p > best:
            best, best_step = p, step
        drop = max(drop, best - p)
    before, final = evals[0][1], evals[-1][1]
    return {"before": before, "final": final, "gain_points": 100 * (final - before),
            "best": best, "best_step": best_step, "largest_drop_points": 100 * drop,
            "curve": [[s, p] for s, p in evals]}


def _median(runs: list[dict]) -> dict:
    keys = ("before", "final", "gain_points", "best", "largest_drop_points", "s_per_step",
            "restores")
    return {key: statistics.median(r[key] for r in runs) for key in keys}


def _print_table(by_family: dict) -> None:
    print("held-out pass@1 per arm (medians over rounds; the same steps each; guard off but in "
          "the guarded arm)")
    print(f"{'family':>8} {'arm':>14} {'before':>7} {'final':>7} {'gain':>7} {'best':>7} "
          f"{'drop':>6} {'s/step':>7} {'restores':>8}")
    for family, arms in by_family.items():
        for arm, f in arms.items():
            print(f"{family:>8} {arm:>14} {f['before']:7.3f} {f['final']:7.3f} "
                  f"{f['gain_points']:+7.1f} {f['best']:7.3f} {f['largest_drop_points']:6.1f} "
                  f"{f['s_per_step']:7.2f} {f['restores']:8g}")


if __name__ == "__main__":
    raise SystemExit(main(sys.modules[__name__], "controls"))
