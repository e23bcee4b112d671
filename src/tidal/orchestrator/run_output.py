"""What an RL run writes, assembled from its state: each step's record (rollout_metrics,
step_record), summary.json and its sections (run_summary, write_summary), and metrics.jsonl
trimmed back to the last checkpoint on resume (trim_metrics). The record types themselves are
records.py; loop.Run decides when each is written."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from tidal.fsutil import write_text_atomic
from tidal.harness.gateway_metrics import GatewayMeans
from tidal.hardware import cpu_facts
from tidal.orchestrator.numerics_watch import mismatch_summary
from tidal.orchestrator.records import EpisodeMeans, RolloutMetrics, RunState, RunSummary, StepRecord
from tidal.orchestrator.topology import placement_of
from tidal.telemetry.metrics import read_metrics, write_json_atomic

if TYPE_CHECKING:  # annotations only
    from tidal.config import TidalConfig
    from tidal.orchestrator.guard import Guard
    from tidal.orchestrator.records import EvalRecord, GuardEvent
    from tidal.orchestrator.worker import RolloutResult
    from tidal.trainer.stats import TrainStats
    from tidal.trajectory import Trajectory


def rollout_metrics(trajs: list[Trajectory]) -> RolloutMetrics:
    rewards = torch.tensor([t.reward for t in trajs], dtype=torch.float64)
    return RolloutMetrics(
        reward_mean=rewards.mean().item() if len(trajs) else 0.0,
        reward_std=rewards.std().item() if len(trajs) > 1 else 0.0,
        pass_rate=sum(t.solved for t in trajs) / len(trajs) if trajs else 0.0,
        reasons=dict(Counter(t.reason for t in trajs)),
        episode=EpisodeMeans.of(trajs),
        gateway=GatewayMeans.of(trajs),
    )


def step_record(state: RunState, version: int, results: list[RolloutResult], trajs: list[Trajectory],
                hist: Counter, train: TrainStats | None, train_s: float, publish_s: float,
                num_workers: int, last_wall_s: float) -> StepRecord:
    """The record of the step just trained (``state`` already counts it)."""
    gen_s = sum(r.generate_s for r in results)
    gen_tokens = sum(r.generated_tokens for r in results)
    train_tokens = sum(len(s.prompt_ids) + len(s.completion_ids) for t in trajs for s in t.segments)
    return StepRecord(
        step=state.step, version=version, wall_s=state.rl_wall_s, rollout=rollout_metrics(trajs),
        trajectories=len(trajs), dropped_stale=state.dropped_stale, kept_stale=state.kept_stale,
        staleness_hist=dict(hist), staleness_max=max(hist) if hist else 0,
        gen_tokens_per_s=gen_tokens / max(gen_s, 1e-9) * len(results),
        train_tokens_per_s=train_tokens / max(train_s, 1e-9),
        generate_s=gen_s, grade_s=sum(r.grade_s for r in results), train_s=train_s, publish_s=publish_s,
        worker_busy_fraction=state.worker_busy_fraction(num_workers),
        worker_failures=state.worker_failures, step_time_s=state.rl_wall_s - last_wall_s, train=train)



def run_summary(cfg: TidalConfig, s: RunState, before: EvalRecord, after: EvalRecord, final_checkpoint,
                init_checkpoint: str, heldout_tasks: int, guard: dict | None, fleet: dict) -> RunSummary:
    """summary.json of a run that evaluated ``before`` and ``after`` RL (``guard``, ``fleet``: its
    sections, guard_summary and fleet_summary)."""
    oc = cfg.orchestrator
    return RunSummary(
        heldout_pass1_before=before.heldout_pass1, heldout_pass1_after=after.heldout_pass1,
        heldout_gain=after.heldout_pass1 - before.heldout_pass1,
        heldout_pass1_by_level_before=before.pass1_by_level,
        heldout_pass1_by_level_after=after.pass1_by_level,
        heldout_tasks=heldout_tasks, heldout_samples_per_task=oc.eval_samples_per_task,
        steps=s.step, trajectories=s.trajectories, dropped_stale=s.dropped_stale,
        kept_stale=s.kept_stale, max_staleness=oc.max_staleness,
        max_staleness_seen=s.max_staleness_seen,
        worker_busy_fraction=s.worker_busy_fraction(oc.num_workers),
        worker_failures=s.worker_failures, num_workers=oc.num_workers, backend=oc.backend,
        rl_wall_s=s.rl_wall_s, final_checkpoint=str(final_checkpoint),
        init_checkpoint=init_checkpoint, dtypes=cfg.dtype_choices(),
        cpu=cpu_facts().record(), numerics=numerics_record(cfg) | mismatch_summary(s),
        integrity=integrity_summary(cfg, s), fleet=fleet,
        heldout_pass1_best=s.best.heldout_pass1, best_step=s.best.step,
        best_checkpoint=s.best.path, guard=guard)


def guard_summary(guard: Guard, state: RunState, stopped: GuardEvent | None) -> dict | None:
    """summary.json's ``guard`` (RunSummary.guard); None when the guard is off."""
    if not guard.on:
        return None
    return {"policy": guard.cfg.policy, "restores": state.restores,
            "events": [{k: v for k, v in e.to_json().items() if k != "kind"}
                       for e in state.guard_events],
            "stopped": None if stopped is None else stopped.message}


def fleet_summary(cfg: TidalConfig, s: RunState, extra: dict) -> dict:
    """summary.json's ``fleet`` (RunSummary.fleet); ``extra``: what the run's pools add."""
    oc = cfg.orchestrator
    pools = [{"name": p.name, "region": p.region, "device": p.device,
              "placement": placement_of(p, oc.backend)}
             for p in cfg.fleet.pools_or_default(oc.num_workers)]
    return {"pools": pools, "member_s": s.member_s, "joined": s.joined, "left": s.left,
            "requeued": s.requeued, "duplicates": s.duplicates, **extra}


def integrity_summary(cfg: TidalConfig, state: RunState) -> dict | None:
    """summary.json's ``integrity`` (see RunSummary.integrity); None when nothing kept evidence."""
    evals = [e for e in state.evals if e.integrity is not None]
    if not state.integrity.episodes and not evals:
        return None
    return {"policy": cfg.env.integrity.policy, "min_confidence": cfg.env.integrity.min_confidence,
            "train": state.integrity.to_json(),
            "evals": [{"label": e.label, "step": e.step, "flag_rate": e.integrity.flag_rate,
                       "cheat_rate": e.integrity.cheat_rate,
                       "canary_cheat_rate": e.integrity.canary_cheat_rate} for e in evals]}



def numerics_record(cfg) -> dict:
    """engine.numerics and, in deterministic mode, the path of each op the start-up probe chose on
    this machine (tidal.numerics.probe), as the engine and the trainer run them."""
    if cfg.engine.numerics != "deterministic":
        return {"mode": cfg.engine.numerics}
    from tidal.numerics.probe import ProbeShapes, choose_paths, shape_name

    paths = choose_paths(getattr(torch, cfg.model.dtype), ProbeShapes.of_model(cfg.model))
    return {"mode": "deterministic", "dtype": cfg.model.dtype, "linear": paths.linear,
            "linear_by_shape": {shape_name(m): p for m, p in paths.linear_by_shape.items()},
            "attention": paths.attention, "silu": paths.silu, "rms_norm": paths.rms_norm,
            "moe_stacked": paths.moe_stacked}


def trim_metrics(path: Path, state: RunState) -> None:
    """Forget what a killed run logged after its last checkpoint: those steps will run again.
    Reads the JSON form (StepRecord, EvalRecord, GuardEvent, WorkerSpan, WorkerFailure) from disk."""
    keep = []
    for r in read_metrics(path):
        if r.get("kind") in ("step", "eval", "guard") and r.get("step", 0) > state.step:
            continue
        if r.get("kind") == "eval" and r.get("label") == "after":
            continue
        if r.get("kind") in ("worker", "worker_failure", "membership") and r.get("end_s", r.get("wall_s", 0)) > state.rl_wall_s:
            continue
        keep.append(json.dumps(r, sort_keys=True))
    write_text_atomic(path, "".join(line + "\n" for line in keep))


def write_summary(run_dir: str | Path, summary: RunSummary) -> Path:
    path = Path(run_dir) / "summary.json"
    write_json_atomic(path, summary.to_json())
    return path
