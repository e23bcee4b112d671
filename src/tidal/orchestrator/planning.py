"""What each RL step trains on, as pure functions of the config: the step's tasks (with canaries),
their split into assignments, and the staleness gate with GRPO's whole-group rule. The loop
(loop.Run) and the fleet simulator (tidal.fleet.sim_events) both call them, so they live apart
from the loop's workers, trainer and files."""

from __future__ import annotations

import random
from collections import Counter
from typing import TYPE_CHECKING

from tidal.orchestrator.scheduler import split_step

if TYPE_CHECKING:  # annotations only
    from tidal.config import TidalConfig
    from tidal.env import EnvironmentSpec
    from tidal.orchestrator.records import RunState
    from tidal.orchestrator.worker import Assignment
    from tidal.trajectory import Trajectory


def training_tasks(cfg: TidalConfig, env: EnvironmentSpec, step: int) -> list:
    """The tasks of step ``step``: a pure function of (seed, step), so a resumed run continues.
    Where the environment makes canaries, each task is replaced by its impossible version with
    probability ``env.integrity.canary_rate``."""
    tasks = env.sample_tasks(cfg.orchestrator.tasks_per_step, cfg.run.seed * 1_000_003 + step, False)
    return with_canaries(tasks, env, cfg.env.integrity.canary_rate,
                         random.Random(f"canaries-{cfg.run.seed}-{step}"))


def with_canaries(tasks: list, env: EnvironmentSpec, rate: float, rng: random.Random) -> list:
    """``tasks`` with each replaced by ``env.make_canary(task, rng)`` with probability ``rate``
    (unchanged where the environment makes no canaries)."""
    make = env.make_canary
    if make is None or rate <= 0:
        return tasks
    return [make(t, rng) if rng.random() < rate else t for t in tasks]


def with_decay(trainer_cfg, steps: int):
    """trainer.decay_steps 0 means "the run's own length": the steps after warm-up."""
    if trainer_cfg.decay_steps:
        return trainer_cfg
    return trainer_cfg.model_copy(update={"decay_steps": max(1, steps - trainer_cfg.warmup_steps)})


def plan_step(cfg: TidalConfig, env: EnvironmentSpec, step: int, first_id: int,
              workers: int | None = None) -> list[Assignment]:
    """Split step ``step``'s tasks into one assignment per worker (``workers``: the fleet's
    members now; default orchestrator.num_workers), fewer if tasks are few."""
    oc = cfg.orchestrator
    parts = oc.num_workers if workers is None else workers
    return split_step(training_tasks(cfg, env, step), step, first_id, parts, oc.max_staleness)


def staleness_gate(trajs: list[Trajectory], trainer_version: int, max_staleness: int,
                   state: RunState, keep_stale: bool = False,
                   floor: int = 0) -> tuple[list[Trajectory], Counter]:
    """Drop (and count) trajectories whose oldest token is more than max_staleness versions old;
    with ``keep_stale`` keep them for the off-policy-corrected loss, counted as kept_stale.
    ``max_staleness_seen`` is the largest staleness in what is trained. ``floor``: trajectories
    with a token older than this version are dropped (and counted) whatever ``keep_stale`` says:
    they were sampled by a policy the guard threw away (RunState.restored_version)."""
    kept, hist = [], Counter()
    for t in trajs:
        if not t.versions:  # nothing generated (an episode skipped as prompt_too_long)
            kept.append(t)
            continue
        if t.min_version < floor:
            state.dropped_stale += 1
            continue
        staleness = trainer_version - t.min_version
        if staleness > max_staleness:
            if not keep_stale:
                state.dropped_stale += 1
                continue
            state.kept_stale += 1
        hist[staleness] += 1
        state.max_staleness_seen = max(state.max_staleness_seen, staleness)
        kept.append(t)
    return kept, hist


def complete_groups(trajs: list[Trajectory], group_size: int) -> list[Trajectory]:
    """GRPO needs whole groups: keep only groups that still have all G samples after the gate."""
    sizes = Counter(t.group_id for t in trajs)
    return [t for t in trajs if sizes[t.group_id] == group_size]
