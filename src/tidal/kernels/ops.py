"""The two op sets the MoE forward runs on: ``FastOps`` (plain torch) and ``DeterministicOps``.

    ops = make_ops("deterministic", device)   # Triton kernels on CUDA, pure torch elsewhere
    ops = make_ops("fast", device)            # cuBLAS matmuls, SDPA/flash attention

Both take flat token rows (no padding): ``attention`` gets each query's cache slot and position
and, for whole sequences starting at position 0 (prefill, the trainer's forward), their lengths
``seg_lens``; for decode (one token per slot) ``seg_lens`` is None.

FastOps is what an engine and a trainer would run by default: the trainer's causal attention is
flash attention over each sequence, decode is SDPA of one query against the cache, matmuls pick
their cuBLAS algorithm by shape, experts run as a padded batched matmul and are summed back with
``index_add_`` (atomics on the GPU). Each is correct; none is batch-invariant.

DeterministicOps routes every reduction through an op whose order is fixed per row (see
matmul.py, rowwise.py, attention.py; reference.py on the CPU): prefill, decode and the trainer's
forward all write K/V to a cache and run the same attention kernel; expert outputs are combined
in top-k order with elementwise ops.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tidal.kernels import reference
from tidal.kernels.routing import align_by_expert, sort_by_expert

MODES = ("fast", "deterministic")


class FastOps:
    name = "fast"

    def linear(self, x, weight, out_dtype=None):
        out = F.linear(x, weight)
        return out if out_dtype is None else out.to(out_dtype)

    def rms_norm(self, x, weight, eps):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return weight * h.to(x.dtype)

    def softmax(self, x, log):
        return torch.log_softmax(x.float(), -1) if log else torch.softmax(x.float(), -1)

    def silu_mul(self, gate, up):
        return F.silu(gate) * up

    def normalize_gates(self, weights):
        return weights / weights.sum(-1, keepdim=True)

    def attention(self, q, k, v, cache_k, cache_v, slot, pos, seg_lens, span, scale):
        """q [N, Hq, D], k/v [N, Hkv, D] (written to the caches first) -> [N, Hq, D]."""
        write_cache(cache_k, cache_v, k, v, slot, pos)
        group = q.shape[1] // k.shape[1]
        if seg_lens is not None:  # whole sequences from position 0: causal flash attention
            outs = []
            for qs, ks, vs in zip(q.split(seg_lens), k.split(seg_lens), v.split(seg_lens)):
                qs, ks, vs = (t.transpose(0, 1)[None] for t in (qs, ks, vs))  # [1, H, T, D]
                ks, vs = ks.repeat_interleave(group, 1), vs.repeat_interleave(group, 1)
                out = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale)
                outs.append(out[0].transpose(0, 1))
            return torch.cat(outs)
        keys = cache_k[slot, :, :span].repeat_interleave(group, 1)  # [N, Hq, span, D]
        values = cache_v[slot, :, :span].repeat_interleave(group, 1)
        mask = torch.arange(span, device=q.device)[None, :] <= pos[:, None]  # [N, span]
        out = F.scaled_dot_product_attention(q[:, :, None], keys, values,
                                             attn_mask=mask[:, None, None, :], scale=scale)
        return out[:, :, 0]

    def experts(self, x, ids, weights, gate_up, down):
        """x [M, H], ids/weights [M, k] -> [M, H]: assignments scattered into a per-expert
        padded batch, two batched matmuls, summed back with index_add_ (as engines do)."""
        m, k = ids.shape
        num_experts = gate_up.shape[0]
        order, sorted_ids, counts, rank = sort_by_expert(ids.reshape(-1), num_experts)
        # capacity: M bounds any expert's count (no host sync) unless that wastes too much
        capacity = m if m * num_experts <= 65536 else int(counts.max())
        dest = sorted_ids * capacity + rank
        token = order // k
        batch = x.new_zeros((num_experts * capacity, x.shape[1]))
        batch[dest] = x[token]
        h = torch.bmm(batch.view(num_experts, capacity, -1), gate_up.transpose(1, 2))
        gate, up = h.chunk(2, dim=-1)
        y = torch.bmm(self.silu_mul(gate, up), down.transpose(1, 2)).view(num_experts * capacity, -1)
        y = y[dest] * weights.reshape(-1)[order].to(x.dtype)[:, None]
        return torch.zeros_like(x).index_add_(0, token, y)


class DeterministicOps:
    """Batch-invariant ops: Triton kernels when ``use_triton`` (CUDA), else reference.py."""

    name = "deterministic"

    def __init__(self, use_triton: bool):
        self.use_triton = use_triton
        if use_triton:
            from tidal.kernels import attention, matmul, rowwise

            self._linear, self._attention = matmul.linear, attention.attention
            self._rms_norm, self._softmax = rowwise.rms_norm, rowwise.softmax
            self._matmul = matmul
        else:
            self._linear, self._attention = reference.linear, reference.attention
            self._rms_norm, self._softmax = reference.rms_norm, reference.softmax

    def linear(self, x, weight, out_dtype=None):
        return self._linear(x, weight, out_dtype)

    def rms_norm(self, x, weight, eps):
        return self._rms_norm(x, weight, eps)

    def softmax(self, x, log):
        return self._softmax(x, log)

    def silu_mul(self, gate, up):
        # elementwise: one rounding per element whatever the tensor (on the CPU, SIMD-uniform)
        return F.silu(gate) * up if self.use_triton else reference.silu_mul(gate, up)

    def normalize_gates(self, weights):
        return weights / ordered_sum(weights.unbind(-1))[..., None]

    def attention(self, q, k, v, cache_k, cache_v, slot, pos, seg_lens, span, scale):
        write_cache(cache_k, cache_v, k, v, slot, pos)
        return self._attention(q, cache_k, cache_v, slot, pos, scale)

    def experts(self, x, ids, weights, gate_up, down):
        """Per-assignment expert MLPs (each row on its own), combined in top-k order in fp32."""
        m, k = ids.shape
        inter = down.shape[2]
        flat = ids.reshape(-1)
        if self.use_triton:
            rows, blocks = align_by_expert(flat, gate_up.shape[0], self._matmul.BLOCK_M)
            h = self._matmul.grouped_linear(x, gate_up, rows, blocks, flat.numel(), row_div=k)
            act = self.silu_mul(h[:, :inter], h[:, inter:])
            y = self._matmul.grouped_linear(act, down, rows, blocks, flat.numel(), row_div=1)
        else:
            token = torch.arange(m, device=x.device).repeat_interleave(k)
            h = reference.grouped_linear(x[token], gate_up, flat)
            act = self.silu_mul(h[:, :inter], h[:, inter:])
            y = reference.grouped_linear(act, down, flat)
        y = y.view(m, k, -1).float() * weights.float()[..., None]
        return ordered_sum(y.unbind(1)).to(x.dtype)


def ordered_sum(terms) -> torch.Tensor:
    """t0 + t1 + ... left to right, elementwise: a fixed order whatever the tensors' size."""
    terms = list(terms)
    total = terms[0]
    for t in terms[1:]:
        total = total + t
    return total


def write_cache(cache_k, cache_v, k, v, slot, pos) -> None:
    """Keys/values [N, Hkv, D] of the given tokens into caches [S, Hkv, L, D] at (slot, pos)."""
    cache_k[slot, :, pos] = k
    cache_v[slot, :, pos] = v


def make_ops(mode: str, device: torch.device | str):
    """The op set for ``mode`` ("fast" or "deterministic") on ``device``."""
    if mode == "fast":
        return FastOps()
    if mode == "deterministic":
        return DeterministicOps(use_triton=torch.device(device).type == "cuda")
    raise ValueError(f"unknown numerics mode {mode!r}; choose one of {MODES}")
