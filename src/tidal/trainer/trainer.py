"""The RL trainer: one ``step(batch)`` = one optimizer step of GRPO with a PPO-clipped ratio.

    Batch ──collate──> TrainBatch ──micro-batches──> forward (router replay) ──> ppo_clip_loss
          ──backward, grads summed into fp32 masters──> clip global grad norm ──> AdamW (warm-up LR)
          ──> copy masters into the model ──> version += 1

Why fp32 master weights: a bf16 parameter cannot absorb an update smaller than ~1/256 of its
magnitude, so small-LR RL updates would vanish. With bf16 parameters the trainer keeps fp32
copies (and fp32 optimizer state), steps those, and rounds them into the model after each step.
With fp32 parameters the parameters are the masters.

Why micro-batches are scaled by whole-batch counts: each micro-batch's loss is weighted by the
token (or sequence) count of the *whole* batch, so summed gradients equal those of one big batch
whatever ``micro_batch_size`` is.
"""

from __future__ import annotations

import contextlib
import math
import time

import torch
from torch import nn

from tidal.trainer.config import TrainerConfig
from tidal.trainer.grpo import NO_REPLAY, TrainBatch, collate, ppo_clip_loss, token_logprobs
from tidal.types import Batch


class Trainer:
    """Owns the optimizer and the policy version; the model is shared with whoever publishes it.

    model: a CausalLM (``model(ids) -> fp32 logits``; MoE models accept ``replay_experts``).
    temperature: the engine's sampling temperature, so new logprobs match the recorded ones.
    pad_id: any id inside the vocabulary; pads sit after every real token of a row, so causal
        attention never lets them change a trained position.
    """

    def __init__(self, model: nn.Module, cfg: TrainerConfig, temperature: float = 1.0, pad_id: int = 0):
        self.model = model
        self.cfg = cfg
        self.temperature = temperature
        self.pad_id = pad_id
        self.version = 0
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

    def step(self, batch: Batch) -> dict[str, float]:
        """One optimizer step on ``batch``; returns its metrics: loss, pg_loss, kl (k3 vs the
        behaviour policy), clip_frac, ratio_mean, ratio_max, entropy, grad_norm (before
        clipping), lr, tokens (trained), sequences, adv_mean, adv_abs_mean, step_time_s,
        staleness_max (this version minus the oldest token version in the batch)."""
        start = time.perf_counter()
        tb = collate(batch.trajectories, self.pad_id, self.cfg.normalize_adv_std)
        staleness = [self.version - t.min_version for t in batch.trajectories if t.min_version >= 0]
        stats = self.accumulate_gradients(tb)
        grad_norm = self.clip_gradients()
        lr = self.apply_update()
        self.version += 1
        metrics = self._metrics(tb, stats, grad_norm, lr, time.perf_counter() - start)
        metrics["staleness_max"] = float(max(staleness, default=0))
        return metrics

    def accumulate_gradients(self, tb: TrainBatch) -> dict[str, float]:
        """Forward/backward every micro-batch; leaves the whole batch's gradient in masters' .grad."""
        for m in self.masters:
            m.grad = None
        units = self._loss_units(tb)
        totals = {"loss": 0.0, "pg_loss": 0.0, "tokens": 0.0, "kl": 0.0, "clip_frac": 0.0,
                  "ratio_mean": 0.0, "entropy": 0.0, "ratio_max": -math.inf}
        for start in range(0, tb.num_rows, self.cfg.micro_batch_size):
            mb = tb.rows(start, start + self.cfg.micro_batch_size).to(self.params[0].device)
            with self._autocast():
                logits = self._forward(mb)
            new_lp = token_logprobs(logits, mb.targets, self.temperature)
            loss, st = ppo_clip_loss(
                new_lp, mb.old_logprobs, mb.advantages, mb.loss_mask, self.cfg.clip_eps_low,
                self.cfg.clip_eps_high, self.cfg.loss_agg, kl_coef=self.cfg.kl_coef, num_units=units,
            )
            loss.backward()
            self._move_grads_to_masters()
            n = st["tokens"]
            totals["loss"] += loss.item()
            totals["pg_loss"] += st["pg_loss"]
            totals["tokens"] += n
            for key in ("kl", "clip_frac", "ratio_mean"):
                totals[key] += st[key] * n
            totals["entropy"] += _masked_entropy_sum(logits, mb.loss_mask, self.temperature)
            totals["ratio_max"] = max(totals["ratio_max"], st["ratio_max"] if n else -math.inf)
        n = max(totals["tokens"], 1.0)
        for key in ("kl", "clip_frac", "ratio_mean", "entropy"):
            totals[key] /= n
        if totals["ratio_max"] == -math.inf:
            totals["ratio_max"] = 1.0
        return totals

    def clip_gradients(self) -> float:
        """Clip the global gradient norm to cfg.grad_clip; returns the norm before clipping.
        Parameters without a gradient (an expert no token used) are skipped, also by AdamW."""
        norm = torch.nn.utils.clip_grad_norm_(self.masters, self.cfg.grad_clip).item()
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
        """Linear warm-up over cfg.warmup_steps optimizer steps, then constant cfg.lr."""
        if self.cfg.warmup_steps == 0:
            return self.cfg.lr
        return self.cfg.lr * min(1.0, (version + 1) / self.cfg.warmup_steps)

    # ------------------------------------------------------------------ pieces

    def _loss_units(self, tb: TrainBatch) -> float:
        """The whole batch's aggregation count: trained tokens, or rows that have any."""
        if self.cfg.loss_agg == "token_mean":
            return tb.loss_mask.sum().item()
        return (tb.loss_mask.sum(dim=1) > 0).sum().item()

    def _forward(self, mb: TrainBatch) -> torch.Tensor:
        replay = self._replay_experts(mb)
        if replay is None:
            return self.model(mb.input_ids)
        return self.model(mb.input_ids, replay_experts=replay)

    def _replay_experts(self, mb: TrainBatch) -> torch.Tensor | None:
        """The sampler's experts where recorded; the trainer's own routing elsewhere.

        Segments record experts only for positions that sampled a completion token; prompt and
        padding positions are NO_REPLAY. The model wants a valid id everywhere, so those are
        filled from a no-grad forward of this model's own router (one extra forward, MoE only).
        """
        if mb.experts is None or not self.cfg.router_replay:
            return None
        missing = mb.experts == NO_REPLAY
        if not bool(missing.any()):
            return mb.experts
        with torch.no_grad(), self._autocast():
            _, own = self.model(mb.input_ids, return_experts=True)
        return torch.where(missing, own, mb.experts)

    def _autocast(self):
        params_fp32 = not self.separate_masters
        if self.cfg.dtype == "bfloat16" and params_fp32:
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

    def _metrics(self, tb: TrainBatch, st: dict, grad_norm: float, lr: float, seconds: float) -> dict[str, float]:
        traj_adv = torch.zeros(int(tb.row_traj.max()) + 1)
        traj_adv[tb.row_traj] = tb.advantages
        return {
            "loss": st["loss"],
            "pg_loss": st["pg_loss"],
            "kl": st["kl"],
            "clip_frac": st["clip_frac"],
            "ratio_mean": st["ratio_mean"],
            "ratio_max": st["ratio_max"],
            "entropy": st["entropy"],
            "grad_norm": grad_norm,
            "lr": lr,
            "tokens": st["tokens"],
            "sequences": float(tb.num_rows),
            "adv_mean": traj_adv.mean().item(),
            "adv_abs_mean": traj_adv.abs().mean().item(),
            "step_time_s": seconds,
        }

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict:
        """Optimizer state, fp32 masters (None when the parameters are the masters), version.
        The model's own weights are saved separately (as a Hugging Face folder)."""
        return {
            "version": self.version,
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


def _masked_entropy_sum(logits: torch.Tensor, mask: torch.Tensor, temperature: float) -> float:
    """Sum over trained tokens of the sampling distribution's entropy (nats), without grad."""
    with torch.no_grad():
        t = temperature if temperature > 0 else 1.0
        logp = torch.log_softmax(logits.float() / t, dim=-1)
        ent = -(logp.exp() * logp).sum(-1)
        return (ent * mask).sum().item()
