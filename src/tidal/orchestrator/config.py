"""The RL loop: how many steps, how many tasks and samples per step, when to evaluate (the seed and
thread counts are run-wide: config/run.py)."""

from typing import Literal

from pydantic import Field, model_validator

from tidal.config_section import Section

INVALID_REASONS = ("syntax_error", "no_result")
"""Episode reasons that mean the model's output was not a program at all: funcs' and fixit's
"syntax_error", tidal.env.grading's "no_result" (the program printed no verdict)."""
BUDGET_REASONS = ("turn_budget", "token_budget")
"""Episode reasons that mean the harness ended an episode that never finished (tidal.harness)."""


class GuardConfig(Section):
    """What counts as a collapse and what the run does about one (tidal.orchestrator.guard;
    docs/training.md, "The guard").

    Each detector compares a figure of the latest step (or evaluation) with the run's recent
    level, so a healthy run's noise (a training pass rate that moves +-0.15 between steps of 64
    episodes) stays quiet and a collapse (the pass rate falling to near 0 and entropy rising
    within a few steps, then every reward 0) is caught within a few steps.
    """

    policy: Literal["restore", "stop", "log", "off"] = "restore"
    """On a collapse: "restore" the best checkpoint so far (by held-out pass@1; before any
    evaluation beats the start, the model RL began from) with the learning rate times lr_factor,
    and continue; "stop" the RL loop (the run still evaluates "after", saves and summarises);
    "log" only record the event; "off" run no detector."""
    lr_factor: float = Field(0.5, gt=0, le=1)
    """Each restore multiplies the trainer's learning rate (Trainer.lr_scale) by this."""
    max_restores: int = Field(3, ge=0)
    """Restores allowed in a run; a collapse after that many stops the run."""
    heldout_sigmas: float = Field(2.0, gt=0)
    """Held-out pass@1 has collapsed when it falls below the best so far by more than this many
    binomial standard errors of the best (sqrt(p (1 - p) / held-out tasks): an upper bound of
    the evaluation noise, since every evaluation samples the same tasks with the same seeds)..."""
    heldout_min_drop: float = Field(0.05, ge=0, le=1)
    """...and by at least this much (a fraction: 0.05 = 5 points)."""
    collapse_steps: int = Field(3, ge=1)
    """Training reward has collapsed after at least this many consecutive steps in which every
    reward was the same (rollout reward_std 0) and every advantage 0 (train/adv_abs_mean 0)
    while the training pass rate was below 1 (all solved is saturation, not collapse), once the
    run has had a step with any reward spread (a model that never solves anything has not
    collapsed)..."""
    collapse_chance: float = Field(1e-4, gt=0, lt=1)
    """...and once steps that flat are this unlikely by chance at the recent pass rate p of
    steps with spread (each step of n episodes: p^n + (1 - p)^n). With 64 episodes a step this
    is at once; with 8 (a tiny test run) at p = 0.1, 11 steps."""
    window: int = Field(10, ge=2)
    """Steps whose values make a surge detector's recent level (median or mean)."""
    min_history: int = Field(5, ge=1)
    """A surge detector judges only once its window holds this many steps (at the start, and
    again after each restore)."""
    noise_sigmas: float = Field(3.0, ge=0)
    """A pass-rate crash or an invalid-output surge must also exceed this many binomial
    standard errors of its recent level over the step's n episodes (the level smoothed as
    (k + 1) / (n + 2)), so steps of few episodes are judged by their noise; with 64 episodes
    the fixed thresholds below are the larger."""
    surge_steps: int = Field(2, ge=1)
    """A surge or crash fires after this many consecutive steps beyond its threshold (flagged
    steps do not enter the recent level)."""
    entropy_factor: float = Field(4.0, gt=1)
    """Entropy surge: train/entropy above this times its recent median..."""
    entropy_floor: float = Field(0.1, ge=0)
    """...and above this (nats per token), so a rise from 0.002 to 0.01 is not a surge."""
    invalid_reasons: list[str] = Field(default_factory=lambda: list(INVALID_REASONS))
    """Episode reasons (Trajectory.reason, a step's ``reasons``) that count as invalid output."""
    invalid_rise: float = Field(0.25, gt=0, le=1)
    """Invalid-output surge: the share of a step's episodes with an invalid reason at least this
    far above its recent mean (a fraction of the step's episodes)."""
    budget_reasons: list[str] = Field(default_factory=lambda: list(BUDGET_REASONS))
    """Episode reasons that count as an episode that never finished (budget_surge)."""
    budget_rise: float = Field(0.25, gt=0, le=1)
    """Budget surge: the share of a step's episodes the harness ended on a budget
    (budget_reasons) at least this far above its recent mean."""
    tool_error_rise: float = Field(0.25, gt=0, le=1)
    """Tool-error surge: the share of a step's model turns that were tool errors
    (episode/tool_errors over episode/turns) at least this far above its recent mean."""
    pass_drop: float = Field(0.3, gt=0, le=1)
    """Training pass-rate crash: the step's pass rate this far below its recent mean."""
    numerics_mismatch: Literal["stop", "correct", "log"] = "stop"
    """What `tidal train` does when engine.numerics = "deterministic" and a step trained a token
    whose sampling logprob is not the trainer's bit for bit (the start-up probe's paths do not
    hold on this machine; tidal.orchestrator.numerics_watch). Every choice records a guard event
    (detector "numerics_mismatch") and counts such steps in summary.json. stop = end RL after
    that step, still evaluate and save, then exit with an error naming the step, the op set and
    what to do; correct = go on with trainer.off_policy.kind = "truncated_is" from the next step
    (the loss then weights each token by the trainer's over the engine's probability, as
    engine.numerics = "fast" needs), and say so; log = say so once and go on. Independent of
    ``policy``."""

    @model_validator(mode="after")
    def _history_fits_window(self):
        if self.min_history > self.window:
            raise ValueError(f"orchestrator.guard.min_history ({self.min_history}) exceeds "
                             f"orchestrator.guard.window ({self.window}): the surge detectors "
                             "would never judge; lower min_history or raise window")
        return self


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
    eval_temperature: float | None = Field(None, ge=0)
    """Sampling temperature of held-out evaluation; None = engine.temperature (what training
    samples with), 0 = greedy (then one sample per task is enough: eval_samples_per_task = 1)."""
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
    guard: GuardConfig = Field(default_factory=GuardConfig)
    """The guard that watches the run for a collapse and acts on it ([orchestrator.guard],
    docs/training.md)."""
