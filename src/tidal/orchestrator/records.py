"""What an RL run records, as typed dataclasses: metrics.jsonl lines, summary.json, RunState.

    metrics.jsonl, one JSON object per line, by "kind":
        "step"            StepRecord      one trained step (train/<key>: TrainStats; episode/<key>;
                                          integrity/<key>: IntegrityMetrics, where the
                                          environment keeps evidence)
        "eval"            EvalRecord      one held-out evaluation (before, every eval_every, after;
                                          integrity/<key> with the canaries' cheat rate)
        "worker"          WorkerSpan      a stretch of one worker's time (the report's timeline)
        "worker_failure"  WorkerFailure   a worker that raised or died, and what it was running
        "membership"      Membership      a worker joined or left the fleet (and what was re-queued)
        "guard"           GuardEvent      the guard saw a collapse and what it did (restore, stop)
    summary.json          RunSummary      the run's result (``tidal train`` adds its wall times)
    checkpoints           RunState        what the loop tracks across steps, so a resume continues

``to_json()`` is exactly what is written: readers of finished runs (telemetry/report.py,
plots.py, tensorboard.py, ``trim_metrics`` on resume, users' scripts) read these names from disk,
so tests/test_records.py pins every key. Times named ``*_s`` are seconds; ``wall_s``,
``start_s`` and ``end_s`` count from the start of the RL phase (a resumed run continues the count).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from tidal.evidence.policy import IntegrityMetrics
from tidal.trainer.stats import TrainStats
from tidal.trajectory import Trajectory


def _plain(record, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """The record's fields by name, one level deep (no copies, unlike dataclasses.asdict)."""
    return {f.name: getattr(record, f.name) for f in fields(record) if f.name not in skip}


@dataclass
class EpisodeMeans:
    """Harness statistics (Trajectory.episode) averaged over a step's trained trajectories;
    written as ``episode/<name>``."""

    turns: float
    """Model turns per episode."""
    resets: float
    """Context resets per episode."""
    effective_horizon: float
    """Transcript tokens over the context window, per episode (> 1: outgrew its window)."""
    summary_tokens_mean: float
    """Mean summary length per episode (tokens)."""
    tool_errors: float
    """Tool errors per episode."""

    @classmethod
    def of(cls, trajs: list[Trajectory]) -> EpisodeMeans | None:
        """None for a step that trained nothing."""
        if not trajs:
            return None
        return cls(**{f.name: sum(getattr(t.episode, f.name) for t in trajs) / len(trajs)
                      for f in fields(cls)})


@dataclass
class RolloutMetrics:
    """The rewards and episodes of a step's trained trajectories (0.0 when there are none)."""

    reward_mean: float
    """Mean reward."""
    reward_std: float
    """Sample standard deviation of the reward (0.0 with fewer than 2 trajectories)."""
    pass_rate: float
    """Fraction of trajectories that solved their task, in [0, 1]."""
    reasons: dict[str, int]
    """Trajectories by Trajectory.reason ("pass", "wrong_answer", "turn_budget", ...)."""
    episode: EpisodeMeans | None
    """Harness statistics per episode; None (no episode/ keys) when nothing was trained."""
    gateway: Any = None
    """tidal.harness.gateway_metrics.GatewayMeans of episodes run by an outside harness (gateway/ keys),
    else None."""

    def to_json(self) -> dict[str, Any]:
        out = _plain(self, skip=("episode", "gateway"))
        if self.episode is not None:
            out |= {f"episode/{k}": v for k, v in _plain(self.episode).items()}
        if self.gateway is not None:
            out |= {f"gateway/{k}": v for k, v in _plain(self.gateway).items()}
        return out


@dataclass
class StepRecord:
    """One trained step: its rollouts, staleness, throughput, times and the trainer's statistics."""

    step: int
    """Steps trained so far, this one included (1 = the first)."""
    version: int
    """The trainer's policy version after this step."""
    wall_s: float
    """RL wall time when the step was published."""
    rollout: RolloutMetrics
    """Rewards and episode statistics (written at the top level: reward_mean, ..., episode/*)."""
    trajectories: int
    """Trajectories trained in this step (after the staleness gate and whole-group filter)."""
    dropped_stale: int
    """Trajectories dropped as too stale so far in the run."""
    kept_stale: int
    """Trajectories over the bound kept for the off-policy loss so far (orchestrator.keep_stale)."""
    staleness_hist: dict[int, int]
    """Trained trajectories by staleness (trainer version − oldest token version); JSON keys are
    strings."""
    staleness_max: int
    """Largest staleness trained in this step (0 when nothing was trained)."""
    gen_tokens_per_s: float
    """Generated tokens per second of engine time, times the step's assignments (the workers'
    combined generation rate)."""
    train_tokens_per_s: float
    """Trained tokens (prompt + completion of every segment) per second of train_s."""
    generate_s: float
    """Seconds inside engine steps, summed over the step's assignments."""
    grade_s: float
    """The rest of the rollouts' wall time (environment, tools, grading), summed likewise."""
    train_s: float
    """Seconds of the gate and the trainer's optimizer step."""
    publish_s: float
    """Seconds to publish the new weights."""
    worker_busy_fraction: float
    """Generating + grading time over the workers' combined RL wall time, so far, in [0, 1]."""
    worker_failures: int
    """Worker failures so far in the run."""
    step_time_s: float
    """RL wall time since the previous step (or the start)."""
    train: TrainStats | None
    """The trainer's statistics, written as ``train/<key>``; None when nothing was trained."""
    integrity: IntegrityMetrics | None = None
    """Cheating found in the step's trajectories and what the policy did (screened,
    penalised), written as ``integrity/<key>``; None (no keys) when the environment keeps no
    evidence."""

    def to_json(self) -> dict[str, Any]:
        out = {"kind": "step", **_plain(self, skip=("rollout", "staleness_hist", "train",
                                                    "integrity"))}
        out |= self.rollout.to_json()
        out["staleness_hist"] = {str(k): n for k, n in sorted(self.staleness_hist.items())}
        if self.train is not None:
            out |= {f"train/{k}": v for k, v in self.train.to_json().items()}
        return out | integrity_keys(self.integrity)


@dataclass
class EvalRecord:
    """One held-out pass@1 measurement on the run's fixed held-out tasks."""

    label: str
    """"before" (RL), "step <n>" (every eval_every steps) or "after"."""
    step: int
    """Steps trained when it was measured."""
    version: int
    """The policy version measured."""
    wall_s: float
    """RL wall time when it was measured."""
    heldout_pass1: float
    """Fraction of held-out samples that solved their task, in [0, 1]."""
    pass1_by_level: dict[int, float]
    """heldout_pass1 per task level, where the environment reports levels (JSON keys are strings)."""
    reasons: dict[str, int]
    """Held-out samples by Trajectory.reason."""
    episode: EpisodeMeans | None = None
    """Harness statistics per held-out episode, as a step's (written as ``episode/<name>``);
    None in records written before evaluations kept them."""
    effective_horizon_min: float | None = None
    """The shortest held-out episode's effective horizon (``episode/effective_horizon_min``):
    with the mean, whether every episode outgrew its window, not only most."""
    integrity: IntegrityMetrics | None = None
    """Cheating in the held-out episodes and on the evaluation's canary tasks (so every
    checkpoint has a canary cheat rate), written as ``integrity/<key>``; None (no keys) when the
    environment keeps no evidence."""

    def to_json(self) -> dict[str, Any]:
        out = {"kind": "eval", **_plain(self, skip=("episode", "effective_horizon_min",
                                                    "integrity"))}
        if self.episode is not None:
            out |= {f"episode/{k}": v for k, v in _plain(self.episode).items()}
            out["episode/effective_horizon_min"] = self.effective_horizon_min
        return out | integrity_keys(self.integrity)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> EvalRecord:
        """From ``to_json()`` (metrics.jsonl, a checkpoint's RunState), or the plain fields
        (without episode statistics) of a checkpoint written before RunState kept that form."""
        by_level = {int(k): v for k, v in d["pass1_by_level"].items()}
        own = {k: v for k, v in d.items() if k != "kind" and "/" not in k}
        means = {k.removeprefix("episode/"): v for k, v in d.items() if k.startswith("episode/")}
        low = means.pop("effective_horizon_min", None)
        integrity = {k.removeprefix("integrity/"): v for k, v in d.items()
                     if k.startswith("integrity/")}
        return cls(**{**own, "pass1_by_level": by_level,
                      "episode": EpisodeMeans(**means) if means else None, "effective_horizon_min": low,
                      "integrity": IntegrityMetrics.from_json(integrity) if integrity else None})


def integrity_keys(metrics: IntegrityMetrics | None) -> dict[str, Any]:
    """``integrity/<key>`` for each of the metrics' counts and rates ({} for None)."""
    if metrics is None:
        return {}
    return {f"integrity/{k}": v for k, v in metrics.to_json().items()}


@dataclass
class WorkerSpan:
    """A stretch of one rollout worker's time, as the report's worker timeline draws it."""

    worker: int
    """The worker's index in the pool."""
    state: str
    """"busy" (generating and grading), "wait_weights" or "wait_backpressure"."""
    start_s: float
    """Start, in RL wall time."""
    end_s: float
    """End, in RL wall time."""

    def to_json(self) -> dict[str, Any]:
        return {"kind": "worker", **_plain(self)}


@dataclass
class WorkerFailure:
    """A worker that raised or died; the worker is replaced and the assignment re-run."""

    worker: int
    """The worker's index in the pool."""
    step: int
    """The training step of the assignment it was running."""
    assignment: int
    """That assignment's id."""
    error: str
    """``<ExceptionType>: <message>``, cut to 500 characters."""
    wall_s: float
    """RL wall time when the failure was seen."""

    def to_json(self) -> dict[str, Any]:
        return {"kind": "worker_failure", **_plain(self)}


@dataclass
class Membership:
    """A worker joined or left the fleet (a pool following its capacity schedule, a remote worker
    whose lease was granted, released or expired)."""

    worker: int
    """The worker's fleet-wide id."""
    pool: str
    """The pool it is in."""
    event: str
    """"joined" or "left"."""
    requeued: int | None
    """For "left": the id of the assignment it held, queued again (None if it held none)."""
    wall_s: float
    """RL wall time of the event."""

    def to_json(self) -> dict[str, Any]:
        return {"kind": "membership", **_plain(self)}


@dataclass
class GuardEvent:
    """The guard (tidal.orchestrator.guard) saw a collapse, and what the run did about it."""

    step: int
    """Steps trained when it was seen."""
    detector: str
    """The detector that fired first: "heldout_drop", "reward_collapse", "pass_crash",
    "invalid_surge", "budget_surge", "tool_error_surge" or "entropy_surge"; "numerics_mismatch"
    from tidal.orchestrator.numerics_watch."""
    evidence: dict[str, Any]
    """The figures it judged (the value, its recent level, the threshold...); ``also``: the
    other detectors that fired on the same record."""
    action: str
    """"restore", "stop" or "log" (orchestrator.guard.policy "log": recorded only); a
    "numerics_mismatch" event also "correct" (orchestrator.guard.numerics_mismatch)."""
    lr_scale: float
    """Trainer.lr_scale after the action (lowered by each restore)."""
    restored_step: int | None
    """For "restore": the step of the checkpoint restored (0 = the model RL began from)."""
    version: int
    """The policy version after the action (a restore publishes its weights as a new one)."""
    wall_s: float
    """RL wall time of the event."""
    message: str
    """One line saying what was seen and done, as printed."""

    def to_json(self) -> dict[str, Any]:
        return {"kind": "guard", **_plain(self)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> GuardEvent:
        return cls(**{k: v for k, v in d.items() if k != "kind"})


@dataclass
class BestCheckpoint:
    """The checkpoint with the highest held-out pass@1 so far (the guard restores it)."""

    step: int
    """Steps trained when it was measured (0: the model RL began from)."""
    heldout_pass1: float
    """Its held-out pass@1."""
    path: str
    """Its folder: the init checkpoint for step 0, else run_dir/checkpoints/step_NNNNNN (a
    resumable trainer checkpoint, which nothing prunes)."""
    version: int
    """Its policy version."""

    def to_json(self) -> dict[str, Any]:
        return _plain(self)


@dataclass
class RunSummary:
    """summary.json: a run's result. ``run_rl`` fills the run's fields; ``tidal train`` adds the
    last five (None otherwise; wall_s also None for a resumed run, whose start is unknown)."""

    heldout_pass1_before: float
    """Held-out pass@1 before RL."""
    heldout_pass1_after: float
    """Held-out pass@1 after RL."""
    heldout_gain: float
    """after − before (a fraction; × 100 for points)."""
    heldout_pass1_by_level_before: dict[int, float]
    """Before RL, per task level (JSON keys are strings)."""
    heldout_pass1_by_level_after: dict[int, float]
    """After RL, per task level."""
    heldout_tasks: int
    """Held-out tasks measured."""
    heldout_samples_per_task: int
    """Samples per held-out task (orchestrator.eval_samples_per_task)."""
    steps: int
    """Steps trained."""
    trajectories: int
    """Trajectories trained."""
    dropped_stale: int
    """Trajectories dropped as too stale."""
    kept_stale: int
    """Trajectories over the bound kept for the off-policy loss."""
    max_staleness: int
    """The bound (orchestrator.max_staleness)."""
    max_staleness_seen: int
    """The largest staleness trained."""
    worker_busy_fraction: float
    """Generating + grading time over the workers' combined RL wall time, in [0, 1]."""
    worker_failures: int
    """Worker failures (each replaced, its assignment re-run)."""
    num_workers: int
    """Rollout workers (orchestrator.num_workers)."""
    backend: str
    """Where workers ran: "local" (threads) or "ray"."""
    rl_wall_s: float
    """Wall time of the RL phase (without the held-out evaluations after it)."""
    final_checkpoint: str
    """The final checkpoint's folder."""
    init_checkpoint: str
    """The checkpoint RL started from."""
    dtypes: dict[str, Any]
    """Each dtype setting as requested and as resolved on this machine (TidalConfig.dtype_choices)."""
    cpu: dict[str, Any]
    """The machine's CPU facts (tidal.hardware.cpu_facts)."""
    numerics: dict[str, Any]
    """engine.numerics and, when deterministic, the op paths the probe chose (numerics_record);
    ``mismatched_steps``: steps that broke the deterministic promise (orchestrator.numerics_watch)."""
    pretrain_s: float | None = None
    """Seconds of mid-training (0 when a cached model was reused); set by ``tidal train``."""
    wall_s: float | None = None
    """Seconds of the whole ``tidal train`` (from before mid-training); None when resumed."""
    plot: str | None = None
    """Path of the reward plot (reward.png); set by ``tidal train``."""
    report: str | None = None
    """Path of the HTML report (report.html); set by ``tidal train``."""
    pretrain_budget_bound: bool | None = None
    """Whether mid-training ran into the end of its time budget, so its LR followed the clock and
    the model is not reproducible run to run (pretrain.loop.budget_bound); set by ``tidal train``."""
    integrity: dict[str, Any] | None = None
    """Cheating over the run (None when the environment keeps no evidence): ``policy``, the
    training episodes' totals (``train``: IntegrityMetrics' counts and rates) and, per
    evaluation, the held-out and canary rates (``evals``: label, step, flag_rate, cheat_rate,
    canary_cheat_rate)."""
    fleet: dict[str, Any] | None = None
    """The fleet over the run: ``pools`` (name, region, device, placement), worker-seconds of
    membership, workers ``joined`` and ``left``, assignments ``requeued`` when their worker left,
    ``duplicates`` dropped (results already back: never trained twice), and, where remote pools
    uploaded, what the coordinator refused."""
    heldout_pass1_best: float | None = None
    """Held-out pass@1 of the best checkpoint: the highest of the run's evaluations (before,
    every eval_every, after), so a maximum over noisy measurements, biased upward."""
    best_step: int | None = None
    """The step of the best checkpoint (0 = the model RL began from)."""
    best_checkpoint: str | None = None
    """The best checkpoint's folder (``tidal eval RUN_DIR`` evaluates it beside the final one)."""
    guard: dict[str, Any] | None = None
    """The guard over the run: ``policy``, ``restores``, ``events`` (GuardEvent's JSON form,
    without its kind) and ``stopped`` (the message of the event that stopped the run, or None);
    None when orchestrator.guard.policy is "off"."""

    def to_json(self) -> dict[str, Any]:
        out = _plain(self, skip=("integrity", "fleet"))
        return out | {"integrity": self.integrity, "fleet": self.fleet}


@dataclass
class RunState:
    """What the loop tracks across steps; saved in every checkpoint so a resumed run continues."""

    step: int = 0
    """Steps trained."""
    trajectories: int = 0
    """Trajectories trained."""
    dropped_stale: int = 0
    """Trajectories dropped as too stale."""
    kept_stale: int = 0
    """Trajectories over the bound kept for the off-policy loss."""
    max_staleness_seen: int = 0
    """The largest staleness trained."""
    worker_failures: int = 0
    """Worker failures."""
    rl_wall_s: float = 0.0
    """RL wall time so far."""
    busy_s: float = 0.0
    """Generating + grading seconds, summed over workers."""
    member_s: float = 0.0
    """Worker-seconds of membership: each worker's time in the fleet, summed (the denominator of
    the busy fraction when workers come and go)."""
    joined: int = 0
    """Workers that joined (the first ones included)."""
    left: int = 0
    """Workers that left (capacity shrank, a lease was released or expired)."""
    requeued: int = 0
    """Assignments queued again because the worker holding them left."""
    duplicates: int = 0
    """Results dropped because their assignment's result was already back (never trained)."""
    evals: list[EvalRecord] = field(default_factory=list)
    """Every held-out evaluation so far, "before" first."""
    integrity: IntegrityMetrics = field(default_factory=IntegrityMetrics)
    """Integrity of every trajectory trained so far (the run's totals)."""
    best: BestCheckpoint | None = None
    """The best checkpoint by held-out pass@1 so far (None before the first evaluation, and in
    checkpoints written before the guard: the run then starts it again from "before")."""
    restores: int = 0
    """Times the guard restored the best checkpoint."""
    restored_version: int = 0
    """The version a restore published last (0: none): trajectories with a token older than it
    come from the policy that was thrown away and are dropped (counted as dropped_stale)."""
    guard_events: list[GuardEvent] = field(default_factory=list)
    """Every guard event so far."""
    mismatched_steps: int = 0
    """Steps whose trained tokens were not all the trainer's bits under deterministic numerics
    (tidal.orchestrator.numerics_watch)."""

    def worker_busy_fraction(self, num_workers: int) -> float:
        """Generating + grading time over the workers' combined time in the fleet (RL wall time
        times num_workers before membership was tracked)."""
        return self.busy_s / max(self.member_s or self.rl_wall_s * num_workers, 1e-9)

    def to_checkpoint(self) -> dict[str, Any]:
        """Plain data (no tidal classes), so a checkpoint loads whatever this module becomes."""
        return {**_plain(self, skip=("evals", "integrity", "best", "guard_events")),
                "evals": [e.to_json() for e in self.evals], "integrity": self.integrity.to_json(),
                "best": None if self.best is None else self.best.to_json(),
                "guard_events": [e.to_json() for e in self.guard_events]}

    @classmethod
    def from_checkpoint(cls, d: dict[str, Any]) -> RunState:
        """(A checkpoint written before RunState kept integrity totals starts them at zero; one
        written before the guard has no best, restores or events.)"""
        best = d.get("best")
        return cls(**{**d, "evals": [EvalRecord.from_json(e) for e in d["evals"]],
                      "integrity": IntegrityMetrics.from_json(d.get("integrity", {})),
                      "best": None if best is None else BestCheckpoint(**best),
                      "guard_events": [GuardEvent.from_json(e) for e in d.get("guard_events", [])]})
