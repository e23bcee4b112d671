"""Held-out pass@1: the fraction of held-out tasks solved (``Trajectory.solved``, by the
environment's success rule) by one sample at the run's sampler, through the same harness as
training. A task skipped as prompt_too_long counts as unsolved (and in ``reasons``).

Averaged over ``samples_per_task`` independent samples per task (an unbiased estimate of pass@1
with lower variance than a single sample), with the same sampler settings before and after RL.
Beside it, how the episodes went through the harness (``episode``: the means of
``Trajectory.episode``, as a training step records them, and the shortest effective horizon),
so a long-horizon evaluation says whether its episodes outgrew the window.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tidal.harness import HarnessConfig, run_episodes
from tidal.harness.seeds import derive_seed


def heldout_pass1(engine, env, tasks: list[Any], harness_cfg: HarnessConfig,
                  samples_per_task: int = 2, run_seed: int | None = None, client=None,
                  min_confidence: float = 0.5) -> dict:
    """``env``: the EnvironmentSpec; pass1_by_level groups by ``Trajectory.level`` where the
    environment reports one. ``run_seed``: run.seed; every evaluation of a run then samples with
    the same random numbers (harness.seeds), so the same weights give the same pass@1 bit for
    bit and two checkpoints differ by their weights only. None = the engine's generator.
    ``client``: a scripted policy in place of the engine's sampling (see run_episodes; ``engine``
    then supplies only its tokenizer and settings), graded alike. ``integrity``: the episodes'
    IntegrityMetrics (findings at least ``min_confidence`` sure flag an episode)."""
    from tidal.orchestrator.records import EpisodeMeans

    from tidal.evidence.policy import measure

    seed = None if run_seed is None else derive_seed(run_seed, "heldout")
    trajs, stats = run_episodes(engine, env, tasks, harness_cfg, samples_per_task, seed=seed,
                                client=client)
    solved = [float(t.solved) for t in trajs]
    by_level: dict[int, list[float]] = {}
    for t, ok in zip(trajs, solved):
        if t.level is not None:
            by_level.setdefault(t.level, []).append(ok)
    return {
        "pass1": sum(solved) / len(trajs),
        "reward_mean": sum(t.reward for t in trajs) / len(trajs),
        "pass1_by_level": {lvl: sum(r) / len(r) for lvl, r in sorted(by_level.items())},
        "reasons": dict(Counter(t.reason for t in trajs)),
        "episode": asdict(EpisodeMeans.of(trajs)),
        "effective_horizon_min": min(t.episode.effective_horizon for t in trajs),
        "tasks": len(tasks),
        "samples": len(trajs),
        "tokens_per_s": stats.generated_tokens / max(stats.generate_s, 1e-9),
        "integrity": measure([t.integrity for t in trajs], min_confidence),
    }


def eval_canaries(env, heldout: list[Any], n: int, seed: int) -> list[Any]:
    """``n`` impossible tasks made from the first held-out tasks (the same at every evaluation
    of a run, so checkpoints compare on one set); [] where the environment makes none."""
    make = env.make_canary
    if make is None or n <= 0:
        return []
    rng = random.Random(f"eval-canaries-{seed}")
    return [make(heldout[i % len(heldout)], rng) for i in range(n)]


def canary_metrics(engine, env, canaries: list[Any], harness_cfg: HarnessConfig,
                   run_seed: int | None, min_confidence: float):
    """IntegrityMetrics of one sample per canary task (empty metrics for no canaries)."""
    from tidal.evidence.policy import IntegrityMetrics, measure

    if not canaries:
        return IntegrityMetrics()
    seed = None if run_seed is None else derive_seed(run_seed, "canaries")
    trajs, _ = run_episodes(engine, env, canaries, harness_cfg, 1, seed=seed)
    return measure([t.integrity for t in trajs], min_confidence)


def eval_engine_config(cfg):
    """The engine settings held-out evaluation samples with: the run's, at
    orchestrator.eval_temperature where one is set (0: greedy)."""
    t = cfg.orchestrator.eval_temperature
    return cfg.engine if t is None else cfg.engine.model_copy(update={"temperature": t})


def evaluate_checkpoint(cfg, env, checkpoint: Path, tasks: int | None) -> dict:
    """Held-out pass@1 (and the canaries' integrity) of one Hugging Face checkpoint folder."""
    import torch

    from tidal.engine.engine import Engine
    from tidal.model import from_pretrained, load_tokenizer

    oc = cfg.orchestrator
    model = from_pretrained(checkpoint, dtype=getattr(torch, cfg.model.dtype))
    engine = Engine(model, load_tokenizer(checkpoint), eval_engine_config(cfg))
    held = env.sample_tasks(tasks or oc.heldout_tasks, oc.heldout_seed, True)
    ic = cfg.env.integrity
    result = heldout_pass1(engine, env, held, cfg.harness, oc.eval_samples_per_task, cfg.run.seed,
                           min_confidence=ic.min_confidence)
    canaries = eval_canaries(env, held, ic.eval_canaries, oc.heldout_seed)
    integrity = result["integrity"].add(canary_metrics(engine, env, canaries, cfg.harness,
                                                       cfg.run.seed, ic.min_confidence))
    result["integrity"] = integrity.to_json() if integrity.episodes else None
    result["checkpoint"] = str(checkpoint)
    return result
