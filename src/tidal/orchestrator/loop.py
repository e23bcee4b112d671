"""The RL run (`tidal train`): mid-train if needed, then GRPO on the coding task family.

Dataflow of one step (synchronous: max_staleness = 0, generation and training alternate):

    training tasks (step s) ──> Engine.generate (G samples each, tokens carry policy version v)
         ──> Sandbox: grade every completion against hidden tests ──> Trajectories (reward, reason)
         ──> staleness gate (trainer version − oldest token version ≤ max_staleness)
         ──> Trainer.step(Batch) ──> version v+1 ──> Engine.load_weights(v+1)

Back-pressure is trivial here (one batch in flight); the asynchronous orchestrator keeps the same
pieces and lets generation run ahead. Held-out pass@1 is measured before RL, every
``eval_every`` steps and after RL, on the same tasks with the same sampler settings.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from tidal.config import TidalConfig
from tidal.orchestrator.evaluate import heldout_pass1
from tidal.orchestrator.rollout import sample_and_grade
from tidal.tasks import Task, get_family
from tidal.telemetry.metrics import MetricsLog, write_json_atomic
from tidal.types import Batch, Trajectory


@dataclass
class RunState:
    """What the loop tracks across steps (and what a checkpoint must restore)."""

    step: int = 0
    trajectories: int = 0
    dropped_stale: int = 0
    max_staleness_seen: int = 0
    rl_wall_s: float = 0.0
    evals: list[dict] = field(default_factory=list)


def build_components(cfg: TidalConfig, init_checkpoint: str | Path):
    """Trainer (fp32 master weights), an engine holding its own copy of the weights, a sandbox."""
    from tidal.engine.engine import Engine
    from tidal.model import from_pretrained, load_tokenizer
    from tidal.sandbox import Sandbox
    from tidal.trainer.trainer import Trainer

    torch.manual_seed(cfg.orchestrator.seed)
    if cfg.orchestrator.num_threads:
        torch.set_num_threads(cfg.orchestrator.num_threads)
    policy = from_pretrained(init_checkpoint, dtype=torch.float32)
    serving = from_pretrained(init_checkpoint, dtype=getattr(torch, cfg.model.dtype))
    tokenizer = load_tokenizer(init_checkpoint)
    trainer = Trainer(policy, cfg.trainer, temperature=cfg.engine.temperature)
    engine = Engine(serving, tokenizer, cfg.engine, version=0)
    sandbox = Sandbox(cfg.env.sandbox)
    return trainer, engine, sandbox


def training_tasks(cfg: TidalConfig, step: int) -> list[Task]:
    """The tasks of step ``step``: a pure function of (seed, step), so a resumed run continues."""
    family = get_family(cfg.env.name)
    return family(cfg.env, cfg.orchestrator.tasks_per_step, cfg.orchestrator.seed * 1_000_003 + step,
                  heldout=False)


def staleness_gate(trajs: list[Trajectory], trainer_version: int, max_staleness: int,
                   state: RunState) -> list[Trajectory]:
    """Drop (and count) trajectories whose oldest token is more than max_staleness versions old."""
    kept = []
    for t in trajs:
        staleness = trainer_version - t.min_version
        if staleness > max_staleness:
            state.dropped_stale += 1
            continue
        state.max_staleness_seen = max(state.max_staleness_seen, staleness)
        kept.append(t)
    return kept


def rollout_metrics(trajs: list[Trajectory]) -> dict:
    rewards = torch.tensor([t.reward for t in trajs], dtype=torch.float64)
    reasons: dict[str, int] = {}
    for t in trajs:
        reasons[t.reason] = reasons.get(t.reason, 0) + 1
    return {
        "reward_mean": rewards.mean().item(),
        "reward_std": rewards.std().item() if len(trajs) > 1 else 0.0,
        "pass_rate": (rewards >= 1.0).double().mean().item(),
        "reasons": reasons,
    }


def evaluate(engine, sandbox, heldout: list[Task], cfg: TidalConfig, state: RunState,
             log: MetricsLog, label: str) -> dict:
    result = heldout_pass1(engine, sandbox, heldout, cfg.orchestrator.eval_samples_per_task)
    record = {"kind": "eval", "label": label, "step": state.step, "version": engine.version,
              "wall_s": state.rl_wall_s, "heldout_pass1": result["pass1"],
              "pass1_by_level": result["pass1_by_level"], "reasons": result["reasons"]}
    log.write(record)
    state.evals.append(record)
    return result


def rl_step(cfg: TidalConfig, trainer, engine, sandbox, state: RunState) -> dict:
    """One synchronous GRPO step: sample, grade, gate, train, publish weights to the engine."""
    t0 = time.perf_counter()
    tasks = training_tasks(cfg, state.step)
    trajs, rstats = sample_and_grade(engine, sandbox, tasks, cfg.orchestrator.group_size)
    trajs = staleness_gate(trajs, trainer.version, cfg.orchestrator.max_staleness, state)
    t1 = time.perf_counter()
    train_metrics = trainer.step(Batch(trajs, trainer.version))
    t2 = time.perf_counter()
    engine.load_weights(trainer.model, trainer.version)
    t3 = time.perf_counter()
    state.step += 1
    state.trajectories += len(trajs)
    train_tokens = sum(len(s.prompt_ids) + len(s.completion_ids) for t in trajs for s in t.segments)
    return {
        "kind": "step", "step": state.step, "version": trainer.version,
        **rollout_metrics(trajs),
        "trajectories": len(trajs), "dropped_stale": state.dropped_stale,
        "staleness_max": state.max_staleness_seen,
        "gen_tokens_per_s": rstats.generated_tokens / max(rstats.generate_s, 1e-9),
        "train_tokens_per_s": train_tokens / max(t2 - t1, 1e-9),
        "generate_s": rstats.generate_s, "grade_s": rstats.grade_s,
        "train_s": t2 - t1, "sync_s": t3 - t2, "step_time_s": t3 - t0,
        **{f"train/{k}": v for k, v in train_metrics.items()},
    }


def run_rl(cfg: TidalConfig, run_dir: str | Path, init_checkpoint: str | Path,
           progress: bool = True) -> dict:
    """GRPO from ``init_checkpoint``; writes metrics.jsonl, checkpoints, summary.json, a plot."""
    from tidal.telemetry.progress import progress_bar
    from tidal.trainer.checkpoint import save_checkpoint

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    oc = cfg.orchestrator
    trainer, engine, sandbox = build_components(cfg, init_checkpoint)
    heldout = get_family(cfg.env.name)(cfg.env, oc.heldout_tasks, oc.heldout_seed, heldout=True)
    log = MetricsLog(run_dir / "metrics.jsonl")
    state = RunState()
    before = evaluate(engine, sandbox, heldout, cfg, state, log, "before")
    start = time.perf_counter()
    bar = progress_bar(oc.steps, "RL", progress)
    while state.step < oc.steps and state.rl_wall_s < oc.time_budget_s:
        record = rl_step(cfg, trainer, engine, sandbox, state)
        state.rl_wall_s = time.perf_counter() - start
        record["wall_s"] = state.rl_wall_s
        log.write(record)
        bar.update(1)
        bar.set_postfix(reward=f"{record['reward_mean']:.2f}", stale=state.max_staleness_seen,
                        heldout=f"{state.evals[-1]['heldout_pass1']:.2f}")
        if oc.eval_every and state.step % oc.eval_every == 0 and state.step < oc.steps:
            evaluate(engine, sandbox, heldout, cfg, state, log, f"step {state.step}")
        if oc.checkpoint_every and state.step % oc.checkpoint_every == 0:
            save_checkpoint(trainer, run_dir / "checkpoints" / f"step_{state.step:06d}",
                            extra={"step": state.step})
    bar.close()
    after = evaluate(engine, sandbox, heldout, cfg, state, log, "after")
    final = save_checkpoint(trainer, run_dir / "checkpoints" / f"step_{state.step:06d}",
                            extra={"step": state.step})
    log.close()
    return {
        "heldout_pass1_before": before["pass1"],
        "heldout_pass1_after": after["pass1"],
        "heldout_gain": after["pass1"] - before["pass1"],
        "heldout_pass1_by_level_before": before["pass1_by_level"],
        "heldout_pass1_by_level_after": after["pass1_by_level"],
        "heldout_tasks": len(heldout),
        "heldout_samples_per_task": oc.eval_samples_per_task,
        "steps": state.step,
        "trajectories": state.trajectories,
        "dropped_stale": state.dropped_stale,
        "max_staleness": oc.max_staleness,
        "max_staleness_seen": state.max_staleness_seen,
        "rl_wall_s": state.rl_wall_s,
        "final_checkpoint": str(final),
        "init_checkpoint": str(init_checkpoint),
    }


def write_summary(run_dir: str | Path, summary: dict) -> Path:
    path = Path(run_dir) / "summary.json"
    write_json_atomic(path, summary)
    return path
