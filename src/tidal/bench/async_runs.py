"""The async benchmark's runs: tidal's own loop (orchestrator.loop.Run) per mode and seed, the
held-out curve from its checkpoints, and the simulator's prediction of each run.

    run_one(cfg, run_dir, model)         config.toml, Run(...).run(), summary.json; the in-loop
                                         evaluations (orchestrator.eval_every > 0) are timed
                                         (TimedRun) so their time can be taken out of RL time
    evaluate_checkpoints(cfg, run_dir)   held-out pass@1 of every checkpoint the run saved
                                         (orchestrator.checkpoint_every), after the run, on the
                                         run's held-out tasks with the run's sampler and seed, as
                                         Run.evaluate measures them: off the RL clock
    run_figures(run_dir, points)         what the run recorded, read back from disk
    predict(cfg, model, figures)         simulate_config for the run's config and step count
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tidal.bench.async_figures import (
    curve,
    mean_step_time,
    staleness_hist,
    trajectory_accounting,
)
from tidal.config import ConfigError, TidalConfig
from tidal.orchestrator.loop import Run
from tidal.orchestrator.run_output import write_summary

EVAL_SPANS = "eval_spans.json"
"""Where a run's in-loop evaluations' (start_s, duration_s) are written, in its folder."""


class TimedRun(Run):
    """tidal's Run, with each in-loop held-out evaluation's RL-time span recorded (the loop does
    not record how long an evaluation took; the benchmark takes that time out of RL time)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.eval_spans: list[tuple[float, float]] = []

    def evaluate(self, label: str):
        import time

        t0 = time.time()
        record = super().evaluate(label)
        if label.startswith("step "):
            self.eval_spans.append((t0 - self.rl_start, time.time() - t0))
        return record


def ensure_ray(cfg: TidalConfig) -> None:
    """A Ray of this process's own (``address="local"``) unless RAY_ADDRESS is set: a plain
    ``ray.init()`` joins any cluster another process started on this machine, with other
    settings. Started before a run pins this process, so Ray's daemons are not pinned."""
    if cfg.orchestrator.backend != "ray" or os.environ.get("RAY_ADDRESS"):
        return
    from tidal.orchestrator.ray_pool import start_ray

    start_ray(cfg.orchestrator.ray_num_cpus)


def run_one(cfg: TidalConfig, run_dir: Path, model_dir: Path, progress: bool) -> None:
    """One RL run in ``run_dir``: config.toml (what calibration reads), the run's records,
    summary.json and eval_spans.json."""
    from tidal.config.dump import recipe_tree, to_toml

    if (run_dir / "metrics.jsonl").exists():
        raise ConfigError(f"{run_dir} already holds a run: give another --bench.runs_dir")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.toml").write_text(to_toml(recipe_tree(cfg)) + "\n")
    ensure_ray(cfg)
    run = TimedRun(cfg, run_dir, model_dir, progress)
    write_summary(run_dir, run.run())
    (run_dir / EVAL_SPANS).write_text(json.dumps(run.eval_spans))


def evaluate_checkpoints(cfg: TidalConfig, run_dir: Path, cpus: list[int]) -> list[tuple[float, int, float]]:
    """(wall_s, step, pass@1) of each intermediate checkpoint of the run (the final one is the
    run's own "after" evaluation), measured as Run.evaluate does: the run's held-out tasks,
    orchestrator.eval_samples_per_task samples, run.seed's sampling streams. ``cpus``: where
    to evaluate (the run pinned this process to the trainer's)."""
    import torch

    from tidal.engine.engine import Engine
    from tidal.env import from_config
    from tidal.hardware import pin_process
    from tidal.model import from_pretrained, load_tokenizer
    from tidal.orchestrator.evaluate import heldout_pass1
    from tidal.sandbox import Sandbox
    from tidal.telemetry.metrics import read_metrics

    steps = {r["step"]: r["wall_s"] for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "step"}
    final = max(steps, default=0)
    ckpts = sorted((int(p.name.removeprefix("step_")), p) for p in (run_dir / "checkpoints").glob("step_*")
                   if p.is_dir() and not p.name.startswith("."))
    ckpts = [(s, p) for s, p in ckpts if 0 < s < final and s in steps]
    if not ckpts:
        return []
    pin_process(cpus)
    oc = cfg.orchestrator
    env = from_config(cfg.env, Sandbox(cfg.env.sandbox))
    heldout = env.sample_tasks(oc.heldout_tasks, oc.heldout_seed, True)
    engine = None
    out = []
    for step, path in ckpts:
        model = from_pretrained(path, dtype=torch.float32)
        if engine is None:
            engine = Engine(model.to(getattr(torch, cfg.model.dtype)), load_tokenizer(path), cfg.engine,
                            version=step)
        else:
            engine.load_weights(model, step)
        result = heldout_pass1(engine, env, heldout, cfg.harness, oc.eval_samples_per_task, cfg.run.seed,
                               min_confidence=cfg.env.integrity.min_confidence)
        out.append((steps[step], step, result["pass1"]))
    return out


def run_figures(run_dir: Path, points: list[tuple[float, int, float]]) -> dict[str, Any]:
    """What the run in ``run_dir`` recorded (metrics.jsonl, summary.json, eval_spans.json), with
    the checkpoints' ``points``: the curve, utilisation, staleness, step times, accounting."""
    from tidal.telemetry.metrics import read_metrics

    records = read_metrics(run_dir / "metrics.jsonl")
    summary = json.loads((run_dir / "summary.json").read_text())
    spans_file = run_dir / EVAL_SPANS
    spans = [tuple(s) for s in json.loads(spans_file.read_text())] if spans_file.is_file() else []
    steps = [r for r in records if r["kind"] == "step"]
    evals = [r for r in records if r["kind"] == "eval"]
    before = next(e for e in evals if e["label"] == "before")
    after = next(e for e in evals if e["label"] == "after")
    in_loop = [(e["wall_s"], e["step"], e["heldout_pass1"]) for e in evals if e["label"].startswith("step ")]
    last_wall = max((r["wall_s"] for r in steps), default=0.0)
    pts = [(0.0, 0, before["heldout_pass1"]), *points, *in_loop,
           (last_wall, summary["steps"], after["heldout_pass1"])]
    from tidal.config import load_config

    run_cfg = load_config(run_dir / "config.toml")
    oc = run_cfg.orchestrator
    return {
        "run_dir": str(run_dir), "seed": run_cfg.run.seed,
        "steps": summary["steps"], "rl_wall_s": summary["rl_wall_s"],
        "eval_s_in_loop": sum(d for _, d in spans),
        "before_pass1": before["heldout_pass1"], "final_pass1": after["heldout_pass1"],
        "curve": curve(pts, spans),
        "worker_utilisation": summary["worker_busy_fraction"],
        "staleness_hist": staleness_hist(steps),
        "step_time_s": mean_step_time(steps),
        "generate_s_median": _median(r["generate_s"] + r["grade_s"] for r in steps[1:] or steps),
        "train_s_median": _median(r["train_s"] for r in steps[1:] or steps),
        "trajectories": summary["trajectories"], "dropped_stale": summary["dropped_stale"],
        "accounting": trajectory_accounting(steps, oc.tasks_per_step * oc.group_size),
        "fleet": summary.get("fleet") or {},
        "membership": [r for r in records if r["kind"] == "membership"],
    }


def _median(values) -> float:
    import statistics

    values = list(values)
    return statistics.median(values) if values else 0.0


def predict(cfg: TidalConfig, model, figures: dict[str, Any], seed: int) -> dict[str, Any]:
    """The simulator's prediction for this run's config over the steps it trained."""
    from tidal.fleet.simulate import simulate_config

    sim = simulate_config(cfg, model, max(1, figures["steps"]), seed)
    return {"step_time_s": sim.step_time_s, "worker_utilisation": sim.worker_utilisation,
            "staleness_hist": {str(k): n for k, n in sorted(sim.staleness_hist.items())},
            "steps_per_hour": sim.steps_per_hour, "requeued": sim.requeued, "lost": sim.lost,
            "duplicates": sim.duplicates}
