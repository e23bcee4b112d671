"""The RL trainer: one ``step(batch)`` = one optimizer step of GRPO with a PPO-clipped ratio.

    Batch ──collate──> TrainBatch ──micro-batches──> forward (router replay) ──> off-policy
          weights ──> ppo_clip_loss ──backward, grads summed into fp32 masters──> clip global grad norm ──> AdamW (warm-up LR)
          ──> copy masters into the model ──> version += 1

Why fp32 master weights: a bf16 parameter cannot absorb an update smaller than ~1/256 of its
magnitude, so small-LR RL updates would vanish. With bf16 parameters the trainer keeps fp32
copies (and fp32 optimizer state), steps those, and rounds them into the model after each step.
With fp32 parameters the parameters are the masters.

Why micro-batches are scaled by whole-batch counts: each micro-batch's loss is weighted by the
token (or sequence) count of the *whole* batch, so summed gradients equal those of one big batch
whatever ``micro_batch_size`` is.

Numerics: with ``numerics="deterministic"`` (the engine's default) the forward is the engine's
own batch-invariant forward, computing in ``trainer.dtype`` (which must equal the engine's
model.dtype), and logprobs go through the same op as the engine's sampler, so on the same
weights the recomputed logprob of every sampled token equals the recorded one bit for bit. Each
step's metrics report how far apart they are (``mismatch_*``, ``routing_*``).
"""

from __future__ import annotations

import contextlib
import math
import time

import torch
from torch import nn

from tidal.engine.config import EngineConfig
from tidal.errors import UserError
from tidal.model.shared_prefix import SharedPrefix
from tidal.numerics.metrics import mismatch_metrics, routing_flip_metrics
from tidal.trainer.config import TrainerConfig
from tidal.trainer.grpo import (
    NO_REPLAY,
    TrainBatch,
    collate,
    loss_weights,
    ppo_clip_loss,
    token_logprobs,
)
from tidal.trainer.offpolicy import behaviour_weights
from tidal.trainer.shared_prefix import micro_batches as prefix_micro_batches
from tidal.trainer.schedule import lr_at
from tidal.trainer.stats import (
    GradientStats,
    GradientSums,
    LossStats,
    MismatchStats,
    OffPolicyStats,
    RoutingStats,
    TrainStats,
)
from tidal.trajectory import Batch

DEFAULT_NUMERICS = EngineConfig.model_fields["numerics"].default
"""The trainer runs the engine's numerics; the engine's config owns the default."""


class MissingExpertsError(UserError):
    """trainer.router_replay = "required" but a trained token has no recorded experts."""


class Trainer:
    """Owns the optimizer and the policy version; the model is shared with whoever publishes it.

    model: a CausalLM (``model(ids) -> fp32 logits``; MoE models accept ``replay_experts``).
    temperature: the engine's sampling temperature, so new logprobs match the recorded ones.
    pad_id: any id inside the vocabulary; pads sit after every real token of a row, so causal
        attention never lets them change a trained position.
    numerics: the engine's ``engine.numerics``: "deterministic" runs the engine's batch-invariant
        forward (see the module docs), "fast" the module forward.
    """

    def __init__(self, model: nn.Module, cfg: TrainerConfig, temperature: float = 1.0, pad_id: int = 0,
                 numerics: str = DEFAULT_NUMERICS):
        self.model = model
        self.cfg = cfg
        self.temperature = temperature
        self.deterministic = numerics == "deterministic"
        self.pad_id = pad_id
        self.version = 0
        self.lr_scale = 1.0
        """Multiplies the schedule's learning rate; saved in state_dict (the guard lowers it)."""
        self.reference = _frozen_copy(model) if cfg.kl_coef > 0 and cfg.kl_reference == "initial" else None
        """The model RL began from, for the KL penalty to it (kl_reference = "initial")."""
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("Trainer: the model has no trainable parameters")
        self.separate_masters = any(p.dtype != torch.float32 for p in self.params)
        if self.separate_masters:
            self.masters = [p.detach().float().clone() for p in self.params]
        else:
            self.masters = self.params
        decay = [m for m in self.masters if m.dim() >= 2]
        no_decay = [m for m in self.masters if m.dim() < 2]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=self.lr_at(0),
            betas=cfg.betas,
        )

    # ------------------------------------------------------------------ the step

    def step(self, batch: Batch) -> TrainStats:
        """One optimizer step on ``batch``; returns its statistics (see TrainStats: the loss and
        its parts, the update, and the engine-vs-trainer mismatch of tidal.numerics.metrics)."""
        start = time.perf_counter()
        tb = collate(batch.trajectories, self.pad_id, self.cfg.normalize_adv_std)
        staleness = [self.version - t.min_version for t in batch.trajectories if t.min_version >= 0]
        stats = self.accumulate_gradients(tb)
        grad_norm = self.clip_gradients()
        lr = self.apply_update()
        self.version += 1
        traj_adv = torch.zeros(int(tb.row_traj.max()) + 1)
        traj_adv[tb.row_traj] = tb.advantages
        return TrainStats.of(
            stats, grad_norm=grad_norm, lr=lr, sequences=float(tb.num_rows),
            adv_mean=traj_adv.mean().item(), adv_abs_mean=traj_adv.abs().mean().item(),
            step_time_s=time.perf_counter() - start, staleness_max=float(max(staleness, default=0)))

    def accumulate_gradients(self, tb: TrainBatch) -> GradientStats:
        """Forward/backward every micro-batch; leaves the whole batch's gradient in masters' .grad."""
        for m in self.masters:
            m.grad = None
        units = self._loss_units(tb)
        sums = GradientSums()
        compared = _Comparison()
        device = self.params[0].device
        for mb, prefix in self._micro_batches(self._rows_to_train(tb)):
            mb, prefix = mb.to(device), None if prefix is None else prefix.to(device)
            logits, own_experts, used_experts, filled = self._forward(mb, prefix)
            new_lp = token_logprobs(logits, mb.targets, self.temperature)
            compared.add(mb, new_lp, own_experts, used_experts, self.version)
            loss, st, off = self._loss(mb, new_lp, units, used_experts, prefix)
            entropy = _masked_entropy(logits, mb.loss_mask, self.temperature,
                                      with_grad=self.cfg.entropy_coef > 0)
            loss = loss - self._entropy_bonus(entropy, mb, units)
            loss.backward()
            self._move_grads_to_masters()
            sums.add(loss.item(), st, off, entropy.sum().item(), filled)
        return self._gradient_stats(sums, compared)

    def _entropy_bonus(self, entropy: torch.Tensor, mb: TrainBatch, units: float) -> torch.Tensor:
        """entropy_coef times the micro-batch's share of the batch's mean entropy (aggregated as
        the loss is), or 0: off, or the micro-batch's entropy is at or above entropy_floor."""
        cfg = self.cfg
        if cfg.entropy_coef == 0:
            return torch.zeros(())
        if cfg.entropy_floor > 0:
            mean = (entropy.detach().sum() / mb.loss_mask.sum().clamp(min=1.0)).item()
            if mean >= cfg.entropy_floor:
                return torch.zeros(())
        return cfg.entropy_coef * (entropy * loss_weights(mb.loss_mask, cfg.loss_agg, units)).sum()

    def _micro_batches(self, tb: TrainBatch) -> list[tuple[TrainBatch, SharedPrefix | None]]:
        """(micro-batch, shared prefixes or None): rows grouped by prompt so each distinct
        prompt is computed once (trainer/shared_prefix.py; deterministic numerics, share_prompts), or
        consecutive slices of micro_batch_size rows."""
        size = self.cfg.micro_batch_size
        if self.deterministic and self.cfg.share_prompts:
            replay = self.cfg.router_replay != "off" and getattr(self.model.config, "is_moe", False)
            shared = prefix_micro_batches(tb, size, self.pad_id, replay)
            if shared is not None:
                return shared
        return [(tb.rows(start, start + size), None) for start in range(0, tb.num_rows, size)]

    def _rows_to_train(self, tb: TrainBatch) -> TrainBatch:
        """The rows this process trains, in micro-batch order: all of them, longest first when
        they are cut into several micro-batches (a sharded trainer takes its share here)."""
        if tb.num_rows > self.cfg.micro_batch_size:
            return by_length(tb)
        return tb

    def _gradient_stats(self, sums: GradientSums, compared: _Comparison) -> GradientStats:
        """The batch's statistics from this process's sums (a sharded trainer reduces them)."""
        return sums.result(compared.mismatch(), compared.routing())

    def _loss(self, mb: TrainBatch, new_lp: torch.Tensor, units: float, experts=None,
              prefix: SharedPrefix | None = None) -> tuple[torch.Tensor, LossStats, OffPolicyStats | None]:
        """PPO-clip against the behaviour policy, or decoupled with an off-policy correction;
        dual-clip and the KL penalty as the config says."""
        cfg = self.cfg
        prox, rho, off = None, None, None
        if cfg.off_policy.kind != "none":
            prox = new_lp.detach()  # one optimizer step per batch: the proximal policy is this one
            rho, off = behaviour_weights(prox, mb.old_logprobs, mb.loss_mask, cfg.off_policy)
        loss, st = ppo_clip_loss(
            new_lp, mb.old_logprobs, mb.advantages, mb.loss_mask, cfg.clip_eps_low,
            cfg.clip_eps_high, cfg.loss_agg, kl_coef=cfg.kl_coef, num_units=units,
            prox_lp=prox, token_weight=rho, dual_clip=cfg.dual_clip,
            ref_lp=self._reference_logprobs(mb, experts, prefix),
        )
        return loss, st, off

    def _reference_logprobs(self, mb: TrainBatch, experts,
                            prefix: SharedPrefix | None = None) -> torch.Tensor | None:
        """The frozen initial model's logprobs of the targets (kl_reference = "initial" with a
        KL weight), routed through the same experts as the training forward; else None."""
        if self.cfg.kl_coef == 0 or self.cfg.kl_reference != "initial":
            return None
        if self.reference is None:
            raise RuntimeError("Trainer.reference is None: kl_reference = 'initial' needs the "
                               "frozen copy made at construction")
        moe = getattr(self.model.config, "is_moe", False)
        with torch.no_grad(), self._autocast():
            kwargs = {"replay_experts": experts} if moe else {}
            if prefix is not None:
                kwargs["prefix"] = prefix
            logits = self.reference(mb.input_ids, **kwargs, **self._numerics())
        return token_logprobs(logits, mb.targets, self.temperature)

    def clip_gradients(self) -> float:
        """Clip the global gradient norm to cfg.grad_clip; returns the norm before clipping.
        Parameters without a gradient (an expert no token used) are skipped, also by AdamW."""
        norm = torch.nn.utils.clip_grad_norm_(self.masters, self.cfg.grad_clip)
        norm = (norm.full_tensor() if hasattr(norm, "full_tensor") else norm).item()  # DTensor: sharded
        if not math.isfinite(norm):
            raise FloatingPointError(
                f"non-finite gradient norm ({norm}) at trainer version {self.version}; "
                "lower trainer.lr, or check the batch's logprobs and rewards for inf/nan"
            )
        return norm

    def apply_update(self) -> float:
        """AdamW step at this version's learning rate; copies fp32 masters into the model."""
        lr = self.lr_at(self.version)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        for m in self.masters:
            m.grad = None
        if self.separate_masters:
            with torch.no_grad():
                for p, m in zip(self.params, self.masters):
                    p.copy_(m)
        return lr

    def lr_at(self, version: int) -> float:
        """The learning rate of the optimizer step from ``version``: tidal.trainer.schedule's
        warm-up and decay of cfg.lr, times ``lr_scale`` (lowered by the run's guard after a
        collapse)."""
        return self.lr_scale * lr_at(self.cfg, version)

    def use_off_policy(self, off_policy: OffPolicyConfig) -> None:
        """Correct the loss as ``off_policy`` says from the next step on (the run's guard switches
        a correction on when deterministic numerics broke: orchestrator.numerics_watch)."""
        self.cfg = self.cfg.model_copy(update={"off_policy": off_policy})

    # ------------------------------------------------------------------ pieces

    def _loss_units(self, tb: TrainBatch) -> float:
        """The whole batch's aggregation count: trained tokens, or rows that have any."""
        if self.cfg.loss_agg == "token_mean":
            return tb.loss_mask.sum().item()
        return (tb.loss_mask.sum(dim=1) > 0).sum().item()

    def _forward(self, mb: TrainBatch, prefix: SharedPrefix | None = None):
        """-> (logits [B, T, V], the router's own top-k and the experts the forward routed
        through (replayed or own), each [B, T, layers, k] or None, positions routed by the
        trainer for want of a record). ``prefix``: mb is a suffix view over these prefixes."""
        replay, filled = self._replay_experts(mb)
        moe = getattr(self.model.config, "is_moe", False)
        shared = {} if prefix is None else {"prefix": prefix}
        with self._autocast():
            out = self.model(mb.input_ids, replay_experts=replay, return_experts=moe, **shared,
                             **self._numerics())
        logits, own = out if moe else (out, None)
        return logits, own, (own if replay is None else replay), filled

    def _numerics(self) -> dict:
        """Forward keywords: the engine's deterministic forward in trainer.dtype, or the module
        forward (under autocast for bf16 on fp32 weights, see ``_autocast``)."""
        if not self.deterministic:
            return {}
        return {"deterministic": True, "dtype": getattr(torch, self.cfg.dtype)}

    def _replay_experts(self, mb: TrainBatch) -> tuple[torch.Tensor | None, int]:
        """(replay ids [B, T, layers, k] or None, positions filled by this model's own router).

        Positions without a record (NO_REPLAY: a prompt the engine did not record, padding) get a
        valid id from a no-grad forward of this model's own router (one extra forward)."""
        mode = self.cfg.router_replay
        if mode == "off" or not getattr(self.model.config, "is_moe", False):
            return None, 0
        trained = mb.loss_mask > 0
        if mb.experts is None:
            if mode == "required" and bool(trained.any()):
                raise MissingExpertsError(
                    "trainer.router_replay is 'required' but the batch's segments carry no MoE "
                    "expert ids (Segment.experts is None); record them in the engine, or set "
                    "trainer.router_replay = 'if_available' or 'off'")
            return None, 0
        missing = (mb.experts == NO_REPLAY).any(dim=-1).any(dim=-1)  # [B, T]
        if mode == "required" and bool((missing & trained).any()):
            rows = sorted({int(r) for r in (missing & trained).nonzero()[:, 0]})
            trajectories = sorted({int(mb.row_traj[r]) for r in rows})
            raise MissingExpertsError(
                f"trainer.router_replay is 'required' but trained tokens of trajectories "
                f"{trajectories} (batch indices) have no recorded experts; record them in the "
                "engine, or set trainer.router_replay = 'if_available'")
        real = torch.arange(mb.input_ids.shape[1], device=mb.lengths.device) < mb.lengths.unsqueeze(1)
        filled = int((missing & real).sum())
        if not bool(missing.any()):
            return mb.experts, 0
        with torch.no_grad(), self._autocast():
            _, own = self.model(mb.input_ids, return_experts=True, **self._numerics())
        return torch.where(mb.experts == NO_REPLAY, own, mb.experts), filled

    def _autocast(self):
        params_fp32 = not self.separate_masters
        if self.cfg.dtype == "bfloat16" and params_fp32 and not self.deterministic:
            device = self.params[0].device.type
            return torch.autocast(device_type=device, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _move_grads_to_masters(self) -> None:
        """bf16 parameters: add this micro-batch's gradient into the fp32 masters (accumulating
        in fp32, not in bf16) and free the parameter's gradient. fp32: nothing to do."""
        if not self.separate_masters:
            return
        for p, m in zip(self.params, self.masters):
            if p.grad is None:
                continue
            g = p.grad.float()
            m.grad = g if m.grad is None else m.grad.add_(g)
            p.grad = None

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict:
        """Optimizer state, fp32 masters (None when the parameters are the masters), version.
        The model's own weights are saved separately (as a Hugging Face folder)."""
        return {
            "version": self.version,
            "lr_scale": self.lr_scale,
            "optimizer": self.optimizer.state_dict(),
            "masters": [m.detach().clone() for m in self.masters] if self.separate_masters else None,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore a state_dict(); the model's weights must already be loaded (they are the
        masters for fp32 models; for bf16 ones the saved fp32 masters overwrite them)."""
        masters = state["masters"]
        if (masters is not None) != self.separate_masters:
            raise ValueError(
                "trainer state was saved for a model with "
                + ("bf16 parameters (separate fp32 masters)" if masters is not None else "fp32 parameters")
                + ", but this model's parameters are not; use the same model.dtype as the saved run"
            )
        if masters is not None:
            if len(masters) != len(self.masters):
                raise ValueError(f"trainer state has {len(masters)} master tensors, the model has {len(self.masters)}")
            with torch.no_grad():
                for m, saved, p in zip(self.masters, masters, self.params):
                    m.copy_(saved)
                    p.copy_(saved)
        self.optimizer.load_state_dict(state["optimizer"])
        self.version = int(state["version"])
        self.lr_scale = float(state.get("lr_scale", 1.0))  # checkpoints before the guard: 1


class _Comparison:
    """Engine-vs-trainer mismatch over a step's micro-batches (item 3 of the numerics issue).

    Only tokens whose behaviour version equals the trainer's version are compared: for those the
    trainer's forward ran on exactly the weights that sampled them (before this step's update),
    so any difference is numerics, not learning. Tokens of older versions are left out; a step
    with none reports ``mismatch_tokens`` 0. Routing compares the engine's recorded experts with
    the trainer's own router top-k at the same positions (under replay the trainer trains on the
    engine's experts anyway: a flip there is what replay prevented); ``routing_trained_flip_rate``
    compares them with the experts the training forward actually routed through (0 under replay).
    """

    def __init__(self):
        self.engine_lp, self.trainer_lp = [], []
        self.engine_ex, self.own_ex, self.used_ex = [], [], []

    def add(self, mb: TrainBatch, new_lp: torch.Tensor, own_experts, used_experts, version: int) -> None:
        same = (mb.loss_mask > 0) & (mb.versions == version)
        self.engine_lp.append(mb.old_logprobs[same])
        self.trainer_lp.append(new_lp.detach()[same])
        if own_experts is not None and mb.experts is not None:
            recorded = same & (mb.experts != NO_REPLAY).all(dim=-1).all(dim=-1)
            self.engine_ex.append(mb.experts[recorded])
            self.own_ex.append(own_experts[recorded])
            self.used_ex.append(used_experts[recorded])

    def mismatch(self) -> MismatchStats:
        m = mismatch_metrics(torch.cat(self.engine_lp), torch.cat(self.trainer_lp))
        return MismatchStats(**{k: float(v) for k, v in m.items()})

    def routing(self) -> RoutingStats | None:
        """None for dense models (or a batch without recorded experts)."""
        if not self.engine_ex:
            return None
        engine = torch.cat(self.engine_ex)
        flips = routing_flip_metrics(engine, torch.cat(self.own_ex))
        trained = routing_flip_metrics(engine, torch.cat(self.used_ex))
        return RoutingStats(flips["flip_rate"], flips["tokens_with_flip_fraction"],
                            flips["flip_rate_per_layer"], trained["flip_rate"])


def by_length(tb: TrainBatch) -> TrainBatch:
    """The batch's rows longest first, so each micro-batch (cut to its own longest row by
    ``TrainBatch.rows``) pads its rows to similar lengths: less padded compute, and attention's
    cost falls with the square of the cut. The loss and gradients are sums over rows, so the
    order changes them only by float rounding; each row's logprobs not at all (the
    deterministic forward is row-invariant). Stable, so equal lengths keep the batch's order;
    worth it only when the batch is cut into several micro-batches."""
    return tb.select(torch.argsort(tb.lengths, descending=True, stable=True))


def _masked_entropy(logits: torch.Tensor, mask: torch.Tensor, temperature: float,
                    with_grad: bool) -> torch.Tensor:
    """The sampling distribution's entropy (nats) at each trained token [B, T], 0 elsewhere;
    differentiable only ``with_grad`` (an entropy bonus), else computed without a graph."""
    with torch.set_grad_enabled(with_grad and torch.is_grad_enabled()):
        t = temperature if temperature > 0 else 1.0
        logp = torch.log_softmax(logits.float() / t, dim=-1)
        return -(logp.exp() * logp).sum(-1) * mask


def _frozen_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` that never trains (the KL reference)."""
    import copy

    ref = copy.deepcopy(model)
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref.eval()
