"""RL trainer: GRPO with a PPO-style clipped ratio, AdamW on fp32 master weights."""

from typing import Literal

from pydantic import Field, model_validator

from tidal.config_section import DtypeName, Section


class OffPolicyConfig(Section):
    """How the loss corrects for tokens the trainer's policy would sample with another
    probability than the engine did (staleness, numerics). With a correction, the PPO ratio is
    taken against the proximal policy (the trainer's weights at this step, no grad) and each
    token's loss is weighted by rho, a function of w = pi_prox / pi_behaviour (detached):

    none: no correction, PPO ratio against the behaviour policy (the recorded logprobs);
    decoupled: decoupled PPO, rho = w;
    truncated_is: token-level truncated IS, rho = min(w, is_cap);
    masked_is: masked IS (IcePop), rho = w if mask_low <= w <= mask_high else 0;
    geo_mask: sequence-level geometric-mean masking: every token of a row (segment) whose
        geometric mean of w over its trained tokens lies in [geo_low, geo_high] gets
        rho = min(w, is_cap); every token of any other row gets 0.

    With one optimizer step per batch the proximal policy is the trainer's forward itself, so
    pi_prox needs no extra forward: it is the new logprob, detached.
    """

    kind: Literal["none", "decoupled", "truncated_is", "masked_is", "geo_mask"] = "none"
    """Which correction (see the class docs)."""
    is_cap: float = Field(2.0, gt=0)
    """C: cap on the importance weight w (truncated_is, geo_mask), dimensionless, > 0."""
    mask_low: float = Field(0.5, ge=0)
    """a: masked_is zeroes a token whose w is below this, dimensionless, >= 0."""
    mask_high: float = Field(2.0, gt=0)
    """b: masked_is zeroes a token whose w is above this, dimensionless, > mask_low."""
    geo_low: float = Field(0.9, ge=0)
    """geo_mask zeroes a row (segment) whose geometric-mean w is below this, >= 0."""
    geo_high: float = Field(1.1, gt=0)
    """geo_mask zeroes a row (segment) whose geometric-mean w is above this, > geo_low."""

    @model_validator(mode="after")
    def _check_bands(self) -> "OffPolicyConfig":
        for low, high in (("mask_low", "mask_high"), ("geo_low", "geo_high")):
            if getattr(self, low) >= getattr(self, high):
                raise ValueError(f"trainer.off_policy.{low} ({getattr(self, low)}) must be below "
                                 f"trainer.off_policy.{high} ({getattr(self, high)})")
        return self


class TrainerConfig(Section):
    lr: float = Field(3e-4, gt=0)
    """AdamW learning rate."""
    betas: tuple[float, float] = (0.9, 0.99)
    """AdamW (beta1, beta2) moment decay rates, each in [0, 1)."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW decoupled weight decay, applied to matrices only (not norm gains)."""
    warmup_steps: int = Field(5, ge=0)
    """Linear learning-rate warm-up, optimizer steps."""
    lr_schedule: Literal["constant", "cosine", "linear"] = "cosine"
    """After warm-up: keep lr (constant), or decay it to lr * min_lr_ratio over decay_steps
    optimizer steps along a half cosine or a straight line, then hold it there."""
    decay_steps: int = Field(0, ge=0)
    """Optimizer steps from the end of warm-up to the end of the decay; 0 = the run's own
    length (orchestrator.steps minus warm-up, set by the RL loop; a trainer built alone without
    it keeps lr constant)."""
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    """Where the decay ends, as a fraction of lr."""
    grad_clip: float = Field(1.0, gt=0)
    """Clip the global gradient norm to this value."""
    clip_eps_low: float = Field(0.2, ge=0)
    """PPO ratio clip below: ratio >= 1 - clip_eps_low."""
    clip_eps_high: float = Field(0.28, ge=0)
    """PPO ratio clip above: ratio <= 1 + clip_eps_high (decoupled, as in DAPO)."""
    dual_clip: float = Field(0.0, ge=0)
    """Dual-clip PPO: a token with a negative advantage adds at most dual_clip * |A| to the loss,
    however large its ratio (0 = off; the usual value is 3, must be > 1 when on)."""
    kl_coef: float = Field(0.0, ge=0)
    """Weight of a k3 KL penalty (0 = off) to kl_reference."""
    kl_reference: Literal["behaviour", "initial"] = "behaviour"
    """What the KL penalty holds the policy to. behaviour: the policy that sampled the batch
    (free: its logprobs are recorded); initial: a frozen copy of the model RL began from (one
    extra no-grad forward per micro-batch, and one more copy of the weights in memory)."""
    entropy_coef: float = Field(0.0, ge=0)
    """Weight of an entropy bonus: loss -= entropy_coef * mean entropy of the sampling
    distribution over trained tokens (0 = off)."""
    entropy_floor: float = Field(0.0, ge=0)
    """With entropy_coef > 0: apply the bonus only to micro-batches whose mean entropy (nats per
    token) is below this floor, so it lifts a collapsing policy without flattening a healthy
    one; 0 = always apply it."""
    loss_agg: Literal["token_mean", "seq_mean"] = "token_mean"
    """token_mean: average over all generated tokens in the batch; seq_mean: per sequence first."""
    micro_batch_size: int = Field(16, ge=1)
    """Sequences per forward/backward pass (gradient accumulation over the batch); the batch's
    rows are taken longest first, so each micro-batch pads to about its own length. Smaller
    passes are faster, not only lighter: the attention's [rows, T, keys] tensors stay in cache
    and short rows stop padding to the longest (docs/training.md)."""
    share_prompts: bool = True
    """With deterministic numerics, compute each distinct prompt of a batch once and train every
    row on its completion over the prompt's keys and values (trainer/shared_prefix.py; the logprobs are
    the same bits). GRPO's group_size rows per prompt made the prompt most of the trainer's work."""
    normalize_adv_std: bool = True
    """GRPO: divide group-centred rewards by the group's standard deviation."""
    dtype: DtypeName = "auto"
    """Compute dtype of the training forward pass; master weights and optimizer state are fp32.
    bfloat16 on fp32 parameters runs the forward under autocast; on bf16 parameters it is native.
    "auto" = bfloat16 where this CPU computes bf16 natively, else float32 (as model.dtype, so the
    two agree, which engine.numerics = "deterministic" needs)."""
    router_replay: Literal["required", "if_available", "off"] = "required"
    """MoE: route each position through the experts the engine recorded (Segment.experts and
    prompt_experts), with gate weights from the trainer's own router logits over them.
    required: every trained token must carry recorded experts, else the step fails naming the
    trajectory; if_available: replay what is recorded, the trainer's router elsewhere; off: the
    trainer's router everywhere (to measure the mismatch replay removes). Positions without a
    record that are not trained tokens (a prompt the engine did not record) are routed by the
    trainer's router in both replay modes and counted as ``replay_filled_positions``."""
    off_policy: OffPolicyConfig = OffPolicyConfig()
    """Off-policy correction of the loss ([trainer.off_policy])."""

    @model_validator(mode="after")
    def _check_dual_clip(self) -> "TrainerConfig":
        if 0 < self.dual_clip <= 1:
            raise ValueError(f"trainer.dual_clip ({self.dual_clip}) must be > 1 (3 is usual), or 0 for off")
        return self
