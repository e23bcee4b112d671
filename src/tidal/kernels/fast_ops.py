"""The fast GPU op set of the one fused forward (model/fused.py; the seam: numerics/opset.py):
what a reasonably tuned plain-torch engine runs, the GPU benchmark's peer.

It is numerics/fast.py's FastOps (``F.linear`` = cuBLAS, torch's norms and RoPE) with two
steps replaced for CUDA:

- attention: keys and values through the cache (CachePlan.through_cache), then SDPA: a prefill
  as one masked (or causal) call over the batch's rows, K/V repeated to the q heads (the
  memory-efficient kernel takes a mask but no grouped queries); a decode step with each kv
  head's group of q heads as that head's queries against its cache (no repeat). SDPA's cuDNN
  backend is left out (``FAST_BACKENDS``): torch >= 2.9 prefers it on Hopper, and it builds an
  execution plan for every new shape (tens of ms each) -- in a decode loop the key length grows
  every step, so every step paid a plan build (the first H200 run: fast mode at 62 tok/s on the
  smoke model, 20x slower than the deterministic kernels).
- experts: the (token, expert) assignments sorted by expert, one grouped GEMM per projection
  (``torch._grouped_mm``, as torchtitan's MoE does; a padded batched matmul where that is
  missing or fails), summed back with ``index_add_`` (atomics on the GPU); no host sync.

Each is correct; none is batch-invariant. The trainer's fast forward is the module forward
(qwen3.py), not this op set.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from tidal.kernels.routing import sort_by_expert
from tidal.numerics.fast import FastOps
from tidal.numerics.moe import route

FAST_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
"""SDPA backends the fast GPU path allows, best first (no cuDNN: a plan build per new shape)."""


class FastGpuOps(FastOps):
    """Fast mode on a GPU (see the module docstring)."""

    def __init__(self):
        self.grouped_mm = hasattr(torch, "_grouped_mm")
        """Use ``torch._grouped_mm`` for the experts; cleared (with a printed reason) the first
        time it fails or disagrees with the padded batched matmul."""

    @property
    def experts_path(self) -> str:
        """Which expert compute ran: "grouped_mm" (checked), "padded_bmm", or "unused"."""
        return {"checked": "grouped_mm", False: "padded_bmm"}.get(self.grouped_mm, "unused")

    def self_attention(self, qkv, qk_norm, cos, sin, plan, kv, w):
        b, t = qkv.shape[:2]
        q, k, v = self.rotate_qk(qkv, qk_norm, cos, sin, w)
        k, v = plan.through_cache(*kv, k, v)  # [B, kv_heads, L, D]
        heads, kv_heads, d = w.heads, w.kv_heads, w.head_dim
        with sdpa_kernel(FAST_BACKENDS):
            if t == 1:  # each kv head's q heads are its queries
                queries = q.reshape(b, kv_heads, heads // kv_heads, d)
                out = F.scaled_dot_product_attention(queries, k, v, attn_mask=plan.mask, scale=1.0)
            else:
                group = heads // kv_heads
                out = F.scaled_dot_product_attention(
                    q.transpose(1, 2), k.repeat_interleave(group, 1), v.repeat_interleave(group, 1),
                    attn_mask=plan.mask, is_causal=plan.causal_new, scale=1.0,
                ).transpose(1, 2)
        return out.reshape(b, t, heads * d)

    def moe(self, layer, h, replay, w):
        flat = h.reshape(-1, h.shape[-1])
        ids, gates, own = route(layer.router(flat), w.top_k, w.norm_topk_prob, replay, h.dtype)
        out = self.experts(flat, ids, gates, layer.experts_gate_up_weight,
                           layer.experts_down_weight)
        return out.view_as(h), own

    def experts(self, x, ids, weights, gate_up, down):
        """x [M, H], ids/weights [M, k] -> [M, H]: assignments sorted by expert, grouped (or
        padded batched) matmuls, summed back with index_add_."""
        k = ids.shape[1]
        order, sorted_ids, counts, rank = sort_by_expert(ids.reshape(-1), gate_up.shape[0])
        token = order // k
        weight = weights.reshape(-1)[order].to(x.dtype)[:, None]
        y = None
        if self.grouped_mm and (x.device.type == "cpu" or x.dtype == torch.bfloat16):
            y = self._grouped_or_none(x[token], counts, sorted_ids, rank, gate_up, down)
        if y is None:
            y = self._padded(x[token], counts, sorted_ids, rank, gate_up, down)
        return torch.zeros_like(x).index_add_(0, token, y * weight)

    def _grouped(self, rows, counts, gate_up, down):
        """Rows [A, H] sorted by expert -> expert MLP outputs [A, H] (grouped GEMMs, no padding)."""
        offs = counts.cumsum(0).to(torch.int32)
        gate, up = torch._grouped_mm(rows, gate_up.transpose(1, 2), offs=offs).chunk(2, dim=-1)
        return torch._grouped_mm(self.silu_mul(gate, up), down.transpose(1, 2), offs=offs)

    def _grouped_or_none(self, rows, counts, sorted_ids, rank, gate_up, down):
        """``_grouped``, checked once against ``_padded`` (a private torch op: on an unsupported
        build or GPU it raises, and the benchmark must still run); None if unusable."""
        try:
            y = self._grouped(rows, counts, gate_up, down)
            if self.grouped_mm is True:  # first call: compare with the padded batched matmul
                want = self._padded(rows, counts, sorted_ids, rank, gate_up, down).float()
                err = float((y.float() - want).abs().max() / want.abs().max().clamp_min(1e-6))
                if not err < 2e-2:
                    raise RuntimeError(f"relative error {err:.3g} against the padded bmm")
                self.grouped_mm = "checked"
            return y
        except Exception as exc:  # noqa: BLE001 - fall back to the padded bmm, said once
            print(f"[fast] torch._grouped_mm unusable here ({type(exc).__name__}: {exc}); "
                  "experts use the padded batched matmul", file=sys.stderr)
            self.grouped_mm = False
            return None

    def _padded(self, rows, counts, sorted_ids, rank, gate_up, down):
        """Rows [A, H] sorted by expert scattered into a per-expert padded batch, two batched
        matmuls -> [A, H]. Capacity: A bounds any expert's count (no host sync) unless that
        wastes too much."""
        a, num_experts = rows.shape[0], gate_up.shape[0]
        capacity = a if a * num_experts <= 65536 else int(counts.max())
        dest = sorted_ids * capacity + rank
        batch = rows.new_zeros((num_experts * capacity, rows.shape[1]))
        batch[dest] = rows
        h = torch.bmm(batch.view(num_experts, capacity, -1), gate_up.transpose(1, 2))
        gate, up = h.chunk(2, dim=-1)
        y = torch.bmm(self.silu_mul(gate, up), down.transpose(1, 2))
        return y.view(num_experts * capacity, -1)[dest]
