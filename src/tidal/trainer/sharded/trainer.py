"""One rank of the sharded trainer: tidal's Trainer on an FSDP2 model and 1/N of each batch.

What is shared with Trainer (not copied): collate, the loss, micro-batching, clipping, AdamW,
the statistics. What differs, through Trainer's hooks:

- rows: every rank collates the whole batch (so advantages and the loss's whole-batch units are
  the single-process ones), sorts its rows longest first, and trains rows rank, rank + N, ...;
  a batch whose rows N does not divide gives the short ranks a copy of a row with its loss mask
  zeroed (it adds nothing to the loss, the gradient or any statistic), so every rank runs the
  same micro-batches and FSDP's collectives pair up whatever the rows per step;
- gradients: FSDP reduce-scatters them summed (divide factor 1), so the sharded gradient is the
  single-process one; clip_grad_norm_ on the DTensor shards computes the global norm;
- statistics: the per-rank sums are all-reduced (max for ratio_max) and the engine-vs-trainer
  comparison's tensors gathered, so every rank reports the global numbers.

Why not bit-equal to one process: the gradient of each parameter is a sum over rows taken in
another order (per rank, then across ranks by the reduce-scatter), and the norm is a sum of
per-shard squares; float addition is not associative, so the results agree to rounding (~1e-7
relative in fp32), not bit for bit.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from tidal.errors import UserError
from tidal.parallel.group import Group
from tidal.trainer.grpo import TrainBatch
from tidal.trainer.stats import GradientStats, GradientSums, OffPolicyStats
from tidal.trainer.trainer import Trainer, _Comparison

_SUMMED = ("loss", "pg_loss", "tokens", "entropy", "filled", "kl", "clip_frac", "ratio_mean")


class ShardedTrainer(Trainer):
    """``Trainer`` on a model already sharded by ``shard_model``, for one rank of ``group``."""

    def __init__(self, model, cfg, group: Group, temperature: float = 1.0, pad_id: int = 0,
                 numerics: str = "fast"):
        if cfg.kl_coef > 0 and cfg.kl_reference == "initial":
            raise UserError("trainer.kl_reference = 'initial' is not supported with "
                            "sharding.processes > 1 (the frozen reference would need its "
                            "own sharding); use kl_reference = 'behaviour', or one process")
        super().__init__(model, cfg, temperature=temperature, pad_id=pad_id, numerics=numerics)
        self.group = group

    def _rows_to_train(self, tb: TrainBatch) -> TrainBatch:
        """This rank's rows: longest first, then every N-th, so ranks get similar lengths; padded
        to ceil(rows / N) with untrained copies of the shortest row (see the module docs)."""
        n = self.group.world_size
        order = torch.argsort(tb.lengths, descending=True, stable=True)
        mine = order[self.group.rank::n]
        short = -(-tb.num_rows // n) - len(mine)
        if short == 0:
            return tb.select(mine)
        padded = tb.select(torch.cat([mine, order[-1:].repeat(short)]))
        padded.loss_mask[len(mine):] = 0
        return padded

    def _forward(self, mb: TrainBatch, prefix=None):
        """Trainer's forward; the model's cached inference weights are dropped around it: they
        would point at gathered tensors FSDP frees after the forward."""
        self.model.drop_fused_weights()
        try:
            return super()._forward(mb, prefix)
        finally:
            self.model.drop_fused_weights()

    def _gradient_stats(self, sums: GradientSums, compared: _Comparison) -> GradientStats:
        """All ranks' sums and comparisons combined (the same numbers on every rank)."""
        reduce_sums(sums)
        gather_comparison(compared)
        return super()._gradient_stats(sums, compared)


def reduce_sums(sums: GradientSums) -> None:
    """In place: each running sum summed over ranks, ratio_max maxed."""
    off = sums.off_policy
    values = [getattr(sums, k) for k in _SUMMED]
    if off is not None:
        values += [off.is_masked_tokens, off.is_truncated_tokens, off.is_weight_mean]
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t)
    for k, v in zip(_SUMMED, t.tolist()):
        setattr(sums, k, v)
    if off is not None:
        sums.off_policy = OffPolicyStats(*t[len(_SUMMED):].tolist())
    top = torch.tensor([sums.ratio_max], dtype=torch.float64)
    dist.all_reduce(top, op=dist.ReduceOp.MAX)
    sums.ratio_max = float(top)


def gather_comparison(compared: _Comparison) -> None:
    """In place: every rank's compared tokens (logprobs, experts), rank 0's first."""
    fields = ("engine_lp", "trainer_lp", "engine_ex", "own_ex", "used_ex")
    mine = {k: [t.cpu() for t in getattr(compared, k)] for k in fields}
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    for k in fields:
        setattr(compared, k, [t for part in everyone for t in part[k]])
