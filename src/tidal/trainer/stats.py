"""The trainer's statistics as typed records, from one micro-batch's loss up to one optimizer step.

    ppo_clip_loss ──> LossStats (one micro-batch)     behaviour_weights ──> OffPolicyStats
        └───── summed over micro-batches (GradientSums) ──> GradientStats (accumulate_gradients)
                 + the update (grad norm, lr, advantages, time) ──> TrainStats (Trainer.step)

``TrainStats.to_json()`` is the flat ``{name: float}`` a step record of metrics.jsonl writes under
``train/``: nested parts are flattened with their prefixes (``mismatch_*``, ``routing_*``,
``routing_flip_rate_layer<i>``; the off-policy counts are already named ``is_*``), and parts a
run does not have (no off-policy correction, a dense model) are left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields


@dataclass
class LossStats:
    """One micro-batch's PPO-clip statistics (``ppo_clip_loss``). Means are over its trained
    tokens, so micro-batches combine weighting by ``tokens``."""

    pg_loss: float
    """The aggregated policy-gradient term of the loss (without the KL term)."""
    kl: float
    """Mean k3 estimate of KL(behaviour || current) per trained token (nats)."""
    clip_frac: float
    """Fraction of trained tokens whose ratio was clipped, in [0, 1]."""
    ratio_mean: float
    """Mean importance ratio (current / behaviour, or / proximal when decoupled)."""
    ratio_max: float
    """Largest ratio of a trained token; 1.0 when there is none."""
    tokens: float
    """Trained (loss-mask 1) tokens in the micro-batch."""


@dataclass
class OffPolicyStats:
    """What an off-policy correction did (``behaviour_weights``), over the trained tokens."""

    is_masked_tokens: float
    """Tokens whose weight the correction set to 0 (outside the band)."""
    is_truncated_tokens: float
    """Tokens whose importance weight was capped at ``is_cap``."""
    is_weight_mean: float
    """Mean weight rho per trained token (1.0 = on-policy)."""


@dataclass
class MismatchStats:
    """Engine-vs-trainer logprobs of the tokens sampled by the trainer's own version
    (tidal.numerics.metrics.mismatch_metrics)."""

    tokens: float
    """Tokens compared (those sampled by exactly the weights the trainer ran)."""
    bitwise_equal_fraction: float
    """Fraction of them whose two logprobs are the same bits, in [0, 1]."""
    mean_abs_logprob_diff: float
    """Mean |engine − trainer| logprob (nats)."""
    max_abs_logprob_diff: float
    """Largest |engine − trainer| logprob (nats)."""
    kl_k3: float
    """Mean k3 KL estimate between the two (nats)."""


@dataclass
class RoutingStats:
    """MoE only: how often the trainer's router chose other experts than the engine recorded."""

    flip_rate: float
    """Fraction of (token, layer, slot) expert choices that differ, trainer's own router."""
    tokens_with_flip_fraction: float
    """Fraction of tokens with at least one differing choice."""
    flip_rate_per_layer: list[float]
    """``flip_rate`` per layer, layer 0 first (written as ``routing_flip_rate_layer<i>``)."""
    trained_flip_rate: float
    """``flip_rate`` against the experts the training forward routed through (0 under replay)."""


@dataclass(kw_only=True)
class GradientStats:
    """A whole batch's forward/backward (``Trainer.accumulate_gradients``)."""

    loss: float
    """The batch's loss (sum over micro-batches, each weighted by whole-batch counts)."""
    pg_loss: float
    """Its policy-gradient part."""
    kl: float
    """Mean k3 KL(behaviour || current) per trained token (nats)."""
    clip_frac: float
    """Fraction of trained tokens clipped, in [0, 1]."""
    ratio_mean: float
    """Mean importance ratio per trained token."""
    ratio_max: float
    """Largest importance ratio of a trained token (1.0 when there is none)."""
    entropy: float
    """Mean entropy of the sampling distribution per trained token (nats)."""
    tokens: float
    """Trained tokens in the batch."""
    replay_filled_positions: float
    """Positions without recorded experts that the trainer's own router filled (0 for dense)."""
    mismatch: MismatchStats
    """Engine-vs-trainer logprob mismatch (written as ``mismatch_<field>``)."""
    routing: RoutingStats | None = None
    """MoE routing flips (written as ``routing_<field>``); None for dense models."""
    off_policy: OffPolicyStats | None = None
    """The off-policy correction's counts; None when ``off_policy.kind`` is "none"."""

    def to_json(self) -> dict[str, float]:
        """The flat ``{name: value}`` of these statistics (see the module docstring)."""
        out: dict[str, float] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, MismatchStats):
                out |= {f"mismatch_{k}": v for k, v in vars(value).items()}
            elif isinstance(value, RoutingStats):
                out |= {"routing_flip_rate": value.flip_rate,
                        "routing_tokens_with_flip_fraction": value.tokens_with_flip_fraction,
                        "routing_trained_flip_rate": value.trained_flip_rate}
                out |= {f"routing_flip_rate_layer{i}": r for i, r in enumerate(value.flip_rate_per_layer)}
            elif isinstance(value, OffPolicyStats):
                out |= vars(value)
            elif value is not None:
                out[f.name] = value
        return out


@dataclass(kw_only=True)
class TrainStats(GradientStats):
    """One optimizer step (``Trainer.step``): the batch's gradient statistics and the update."""

    grad_norm: float
    """Global gradient norm before clipping."""
    lr: float
    """Learning rate of this step (after warm-up)."""
    sequences: float
    """Rows trained (one per segment)."""
    adv_mean: float
    """Mean advantage per trajectory."""
    adv_abs_mean: float
    """Mean |advantage| per trajectory."""
    step_time_s: float
    """Seconds the step took (collate, forward/backward, update)."""
    staleness_max: float
    """This version minus the oldest token version in the batch (0 when none is recorded)."""

    @classmethod
    def of(cls, gradients: GradientStats, **update: float) -> TrainStats:
        """``gradients`` plus the update's own fields (grad_norm, lr, ...)."""
        return cls(**{f.name: getattr(gradients, f.name) for f in fields(GradientStats)}, **update)


class GradientSums:
    """Running sums over a batch's micro-batches; ``result`` turns them into GradientStats."""

    def __init__(self):
        self.loss = self.pg_loss = self.tokens = self.entropy = self.filled = 0.0
        self.kl = self.clip_frac = self.ratio_mean = 0.0  # token-weighted sums
        self.ratio_max = -math.inf
        self.off_policy: OffPolicyStats | None = None  # sums; is_weight_mean token-weighted

    def add(self, loss: float, st: LossStats, off: OffPolicyStats | None, entropy_sum: float,
            filled: int) -> None:
        n = st.tokens
        self.loss += loss
        self.pg_loss += st.pg_loss
        self.tokens += n
        self.filled += filled
        self.kl += st.kl * n
        self.clip_frac += st.clip_frac * n
        self.ratio_mean += st.ratio_mean * n
        self.entropy += entropy_sum
        if n:
            self.ratio_max = max(self.ratio_max, st.ratio_max)
        if off is not None:
            s = self.off_policy or OffPolicyStats(0.0, 0.0, 0.0)
            self.off_policy = OffPolicyStats(s.is_masked_tokens + off.is_masked_tokens,
                                             s.is_truncated_tokens + off.is_truncated_tokens,
                                             s.is_weight_mean + off.is_weight_mean * n)

    def result(self, mismatch: MismatchStats, routing: RoutingStats | None) -> GradientStats:
        n = max(self.tokens, 1.0)
        off = self.off_policy
        if off is not None:
            off = OffPolicyStats(off.is_masked_tokens, off.is_truncated_tokens, off.is_weight_mean / n)
        return GradientStats(
            loss=self.loss, pg_loss=self.pg_loss, kl=self.kl / n, clip_frac=self.clip_frac / n,
            ratio_mean=self.ratio_mean / n, ratio_max=1.0 if self.ratio_max == -math.inf else self.ratio_max,
            entropy=self.entropy / n, tokens=self.tokens, replay_filled_positions=self.filled,
            mismatch=mismatch, routing=routing, off_policy=off)
