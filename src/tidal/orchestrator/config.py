"""The RL loop: how many steps, how many tasks and samples per step, when to evaluate (the seed and
thread counts are run-wide: config/run.py)."""

from typing import Literal

from pydantic import Field

from tidal.section import Section


class OrchestratorConfig(Section):
    steps: int = Field(200, ge=0)
    """RL trainer steps."""
    time_budget_s: float = Field(360.0, gt=0)
    """Wall-clock budget for the RL phase, seconds (stops early, still evaluates)."""
    tasks_per_step: int = Field(8, ge=1)
    """Distinct tasks per trainer step."""
    group_size: int = Field(8, ge=2)
    """GRPO samples per task (G)."""
    heldout_tasks: int = Field(256, ge=1)
    """Held-out tasks for pass@1 before and after RL (and at intervals)."""
    heldout_seed: int = 20261130
    """Seed of the held-out task set (fixed, so runs with different seeds compare on one set)."""
    eval_samples_per_task: int = Field(2, ge=1)
    """Samples per held-out task; pass@1 is their mean (lower variance than one sample)."""
    eval_every: int = Field(40, ge=0)
    """Measure held-out pass@1 every this many steps (0 = only before and after)."""
    checkpoint_every: int = Field(50, ge=0)
    """Save a resumable checkpoint every this many steps (0 = only at the end)."""
    max_staleness: int = Field(1, ge=0)
    """Largest trainer version minus the oldest token version allowed in a trained batch. Workers
    generate step s once the trainer reaches version s - max_staleness; 0 = synchronous mode
    (generation and training alternate on the same code path)."""
    keep_stale: bool = False
    """Train on trajectories older than max_staleness instead of dropping them (they are counted
    as kept_stale; the PPO ratio against their recorded behaviour logprobs corrects for them)."""
    in_flight_updates: bool = False
    """Workers load newer weights between decode steps, so a sequence may span versions (each token
    records its own). False: a worker keeps one version for a whole assignment, so within
    max_staleness 1 every trajectory is one version behind the step that trains it. Off by
    default: loading mid-assignment recomputes the KV cache of every running sequence
    (engine.recompute_kv_on_reload), a prefill of the whole batch per version, which made a
    step's generation ~25% slower on 2 cores (tidal bench async) for no gain in staleness."""
    backend: Literal["ray", "local"] = "ray"
    """Where rollout workers run: Ray actors (a local Ray instance, or the cluster at RAY_ADDRESS),
    or threads in the trainer's process (debugging, tests)."""
    num_workers: int = Field(2, ge=1)
    """Rollout workers; each training step's tasks are split among them."""
    ray_num_cpus: int = Field(2, ge=1)
    """CPUs a local Ray instance may schedule (ignored when joining RAY_ADDRESS)."""
    cpus_per_worker: float = Field(0.5, gt=0)
    """Ray CPUs reserved per rollout worker actor (pools of device "cpu"; other kinds ask for one
    unit of the Ray resource "device:<kind>" instead)."""
    ray_place_timeout_s: float = Field(60.0, gt=0)
    """How long a Ray worker actor may wait to be placed on a node before its pool drops it (and
    tries again after as long again): its resource is listed but taken. A pool whose resource
    left the cluster has no workers until a node declares it again."""
