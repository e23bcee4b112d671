"""The deterministic CPU op set: batch-invariant ops (ops.py) on the paths the start-up probe
found invariant on this machine (probe.py), so the engine (KV cache, any batch) and the trainer
(full sequences, with autograd) give a token's logits the same bits.

Dtype policy: everything runs in one compute dtype: the trainer with fp32 master weights casts
them to the engine's dtype inside the forward (model/fused.py), so a bf16 engine and a
bf16-computing trainer see identical weights and identical ops. Norm statistics, softmaxes and
logits are fp32 in both.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tidal.numerics.moe import sparse_moe
from tidal.numerics.ops import DeterministicLinear, KEY_BLOCK, attention, attention_bias, rms_norm, silu
from tidal.numerics.opset import CpuOps
from tidal.numerics.probe import NumericsPaths


class DeterministicOps(CpuOps):
    name = "deterministic"
    trainable = True

    def __init__(self, paths: NumericsPaths):
        self.paths = paths

    def prepare(self, matrix: torch.Tensor) -> DeterministicLinear:
        return DeterministicLinear(matrix, self.paths.linear_path(matrix.shape))

    def stacked_moe(self, trainable: bool) -> bool:
        """The few-token route is the engine's only (the trainer never runs few tokens through
        it), and only where the probe found it equal to the per-expert route."""
        return not trainable and self.paths.moe_stacked

    def rms_norm(self, x, weight, eps):
        return rms_norm(x, weight, eps, self.paths.rms_norm)

    def silu_mul(self, gate, up):
        return silu(gate, self.paths.silu) * up

    def attention_context(self, positions, plan, cache, t):
        """(bias [B, 1, T, 1, L], L, plan): keys are read in whole blocks of KEY_BLOCK."""
        if plan is None:
            length = round_up(t)
            query_at = torch.arange(t, device=positions.device).expand(positions.shape)
        else:
            length = round_up(plan.kv_len)
            if length > cache.max_len:
                raise ValueError(
                    f"the deterministic forward reads keys in blocks of {KEY_BLOCK}: the KV cache "
                    f"needs max_len >= {length} (use KVCache.for_model, which rounds it up)")
            query_at = plan.rope_positions
        return attention_bias(query_at, length), length, plan

    def self_attention(self, qkv, qk_norm, cos, sin, ctx, kv, w):
        bias, length, plan = ctx
        t = qkv.shape[1]
        q, k, v = self.rotate_qk(qkv, qk_norm, cos, sin, w)
        if plan is None:
            pad = (0, 0, 0, length - t)
            keys, values = F.pad(k.transpose(1, 2), pad), F.pad(v.transpose(1, 2), pad)
        else:
            kc, vc = kv
            plan.through_cache(kc, vc, k, v)  # writes the new keys/values; we read whole blocks
            keys = kc[plan.rows, :, :length].to(q.dtype)
            values = vc[plan.rows, :, :length].to(q.dtype)
        return attention(q, keys, values, bias, self.paths.attention)

    def moe(self, layer, h, replay, w):
        return sparse_moe(layer, h, w.top_k, w.norm_topk_prob, replay, self.silu_mul)


def round_up(n: int) -> int:
    """n keys rounded up to whole KEY_BLOCKs (at least one)."""
    return max(-(-n // KEY_BLOCK), 1) * KEY_BLOCK
