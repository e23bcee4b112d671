"""The online learner: users' feedback on served responses -> rewards -> one Trainer step.

    add(LearnEvent...) ──buffer──> step(): the oldest ``events_per_step`` events
        ──> drop those more than ``max_staleness`` versions behind the trainer (counted)
        ──> reward (RewardFunction: the signal, or the behaviour's penalty)
        ──> one Trajectory per response, all in ONE group ──> Trainer.step(Batch)

One group: GRPO's group advantage becomes reward minus the batch's mean reward (over its std
with trainer.normalize_adv_std), a REINFORCE baseline over the step's events. With
``baseline = "prompt"`` (the default) each reward first has the running mean reward of earlier
responses to the same prompt taken off (``PromptBaseline``): users ask the same things again,
and a prompt's own history says far more about how good a response to it was than the step's
mean over unrelated prompts (GRPO's group baseline, spread over time instead of sampled at once). Each response is
one Segment: the served prompt, the served tokens (all trained), the engine's recorded sampling
logprobs and the version that produced them, so the PPO ratio and trainer.off_policy correct
for the staleness of responses served by older versions. A response with no tokens still counts
in the baseline (it was rewarded) but has nothing to train on.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from tidal.online.behaviour import classify
from tidal.online.config import LearnerConfig
from tidal.online.records import LearnEvent
from tidal.online.reward import RewardFunction
from tidal.trainer.stats import TrainStats
from tidal.trainer.trainer import Trainer
from tidal.trajectory import Batch, Segment, Trajectory

GROUP = 0
"""The one GRPO group every trajectory of a step shares (see the module docs)."""


@dataclass
class OnlineStepStats:
    """One learner step."""

    events: int
    """Events learned from (rewarded and in the baseline), empty responses included."""
    dropped_stale: int
    """Events dropped: their response came from a version more than max_staleness behind."""
    reward_mean: float
    """Mean reward of the learned events (0.0 without any)."""
    reward_by_behaviour: dict[str, float]
    """Mean reward per behaviour of the response (action, question, ...)."""
    empty_responses: int
    """Learned events whose response had no tokens (rewarded, nothing to train)."""
    train: TrainStats | None
    """The trainer's step statistics; None when nothing was trainable (no step was taken)."""
    reward_version: str = ""
    """RewardFunction.version of the rewards."""

    def to_json(self) -> dict:
        out = {k: v for k, v in vars(self).items() if k != "train"}
        out["train"] = None if self.train is None else self.train.to_json()
        return out


class OnlineLearner:
    """Buffers LearnEvents and trains on them ``events_per_step`` at a time."""

    def __init__(self, trainer: Trainer, reward: RewardFunction, cfg: LearnerConfig):
        self.trainer = trainer
        self.reward = reward
        self.cfg = cfg
        self.buffer: deque[LearnEvent] = deque()
        self.dropped_stale_total = 0
        self.baseline = PromptBaseline(cfg.baseline_window)

    @property
    def backlog(self) -> int:
        """Events waiting to be learned from (the server's back-pressure reads it)."""
        return len(self.buffer)

    def add(self, events: list[LearnEvent]) -> None:
        """Buffer events (in the order given: the store's ``seq`` order)."""
        self.buffer.extend(events)

    def ready(self) -> bool:
        """Whether a full step's worth of events is buffered."""
        return len(self.buffer) >= self.cfg.events_per_step

    def step(self) -> OnlineStepStats:
        """One step on the oldest ``events_per_step`` events (all there are if fewer)."""
        take = min(self.cfg.events_per_step, len(self.buffer))
        events = [self.buffer.popleft() for _ in range(take)]
        fresh = [e for e in events if not self.is_stale(e)]
        dropped = len(events) - len(fresh)
        self.dropped_stale_total += dropped
        behaviours = [behaviour_of(e) for e in fresh]
        rewards = [self.reward.reward(e.feedback, b) for e, b in zip(fresh, behaviours)]
        centred = rewards
        if self.cfg.baseline == "prompt":
            centred = self.baseline.centre([tuple(e.response.prompt_ids) for e in fresh], rewards)
        trajs = [trajectory(e, r) for e, r in zip(fresh, centred)]
        train = None
        if any(t.segments for t in trajs):
            train = self.trainer.step(Batch(trajs, trainer_version=self.trainer.version))
        return OnlineStepStats(
            events=len(fresh), dropped_stale=dropped,
            reward_mean=sum(rewards) / len(rewards) if rewards else 0.0,
            reward_by_behaviour=_means_by(behaviours, rewards),
            empty_responses=sum(1 for t in trajs if not t.segments),
            train=train, reward_version=self.reward.version)

    def is_stale(self, event: LearnEvent) -> bool:
        """More than max_staleness trainer versions behind the trainer."""
        return self.trainer.version - event.response.version > self.cfg.max_staleness


class PromptBaseline:
    """Running mean reward per prompt: the mean of its rewards so far, exponential (weight
    1 / window) once it has ``window`` of them."""

    def __init__(self, window: int):
        self.window = window
        self.means: dict[tuple[int, ...], tuple[float, int]] = {}

    def centre(self, prompts: list[tuple[int, ...]], rewards: list[float]) -> list[float]:
        """Each reward minus its prompt's mean before this step (the step's own mean for a
        prompt not seen before); then the step's rewards join the means."""
        step_mean = sum(rewards) / len(rewards) if rewards else 0.0
        out = [r - self.means.get(p, (step_mean, 0))[0] for p, r in zip(prompts, rewards)]
        for p, r in zip(prompts, rewards):
            mean, n = self.means.get(p, (0.0, 0))
            n += 1
            self.means[p] = (mean + (r - mean) / min(n, self.window), n)
        return out


def behaviour_of(event: LearnEvent) -> str:
    """The behaviour the server recorded, else the classifier's reading of the text."""
    return event.response.behaviour or classify(event.response.text)


def trajectory(event: LearnEvent, reward: float) -> Trajectory:
    """One response as a one-segment Trajectory in the step's group (no segment when it has
    no tokens)."""
    r = event.response
    n = len(r.token_ids)
    if len(r.logprobs) != n:
        raise ValueError(f"response {r.id}#{r.index}: {n} tokens but {len(r.logprobs)} "
                         "recorded logprobs; the store must keep one logprob per token")
    segments = []
    if n:
        segments = [Segment(list(r.prompt_ids), list(r.token_ids), list(r.logprobs),
                            [r.version] * n, [1] * n, experts=r.experts,
                            prompt_experts=r.prompt_experts)]
    return Trajectory(task_id=f"{r.id}#{r.index}", group_id=GROUP, segments=segments,
                      reward=reward, reason=event.feedback.signal)


def _means_by(keys: list[str], values: list[float]) -> dict[str, float]:
    sums: dict[str, list[float]] = {}
    for k, v in zip(keys, values):
        sums.setdefault(k, []).append(v)
    return {k: sum(v) / len(v) for k, v in sorted(sums.items())}
