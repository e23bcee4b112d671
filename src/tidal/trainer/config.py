"""RL trainer: GRPO with a PPO-style clipped ratio, AdamW on fp32 master weights."""

from typing import Literal

from pydantic import Field

from tidal.section import Section


class TrainerConfig(Section):
    lr: float = Field(3e-4, gt=0)
    """AdamW learning rate."""
    betas: tuple[float, float] = (0.9, 0.99)
    """AdamW (beta1, beta2) moment decay rates, each in [0, 1)."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW decoupled weight decay, applied to matrices only (not norm gains)."""
    warmup_steps: int = Field(5, ge=0)
    """Linear learning-rate warm-up, optimizer steps."""
    grad_clip: float = Field(1.0, gt=0)
    """Clip the global gradient norm to this value."""
    clip_eps_low: float = Field(0.2, ge=0)
    """PPO ratio clip below: ratio >= 1 - clip_eps_low."""
    clip_eps_high: float = Field(0.28, ge=0)
    """PPO ratio clip above: ratio <= 1 + clip_eps_high (decoupled, as in DAPO)."""
    kl_coef: float = Field(0.0, ge=0)
    """Weight of a k3 KL penalty to the behaviour policy (0 = off)."""
    loss_agg: Literal["token_mean", "seq_mean"] = "token_mean"
    """token_mean: average over all generated tokens in the batch; seq_mean: per sequence first."""
    micro_batch_size: int = Field(64, ge=1)
    """Sequences per forward/backward pass (gradient accumulation over the batch)."""
    normalize_adv_std: bool = True
    """GRPO: divide group-centred rewards by the group's standard deviation."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Compute dtype of the training forward pass; master weights and optimizer state are fp32.
    bfloat16 on fp32 parameters runs the forward under autocast; on bf16 parameters it is native."""
    router_replay: bool = True
    """MoE: route each sampled token through the experts the sampler recorded (Segment.experts);
    False lets the trainer's router choose (only to measure the mismatch replay removes)."""
