"""The fast CPU op set: what the engine runs with ``engine.numerics = "fast"``, tuned for speed
at the sizes tidal serves on CPU, where a decode step is bound by per-op overhead. Its results
agree with the module forward to ~1e-6 (tests hold them to 1e-5), not bit for bit.

- Linear: ``PackedLinear``, the faster of MKL and oneDNN per call (below).
- Attention: cached keys/values read as views when the batch's slots are a ``range``; a step
  whose rows all sit at the same positions needs no mask (a fresh prefill attends causally to its
  own keys); decode attends with each kv head's group of q heads as one matmul's rows.
- MoE: numerics/moe.py's per-expert route on PackedLinear experts.
"""

from __future__ import annotations

import functools
import time

import torch
import torch.nn.functional as F

from tidal.numerics.moe import sparse_moe
from tidal.numerics.ops import onednn_usable, pack_for_onednn
from tidal.numerics.opset import CpuOps

CALIBRATION_ROWS = (1, 4, 16, 64, 256)
"""Row counts at which PackedLinear times MKL against oneDNN for a matrix shape (once per
process and shape): oneDNN runs from the first of them where it is clearly faster."""
ONEDNN_MARGIN = 0.9
"""oneDNN must take at most this fraction of MKL's time to be chosen (timings are noisy)."""
MATMUL_ATTENTION_MIN_ROWS = 4
"""Decode batches from this size attend with two batched matmuls, smaller ones with SDPA: SDPA
is the faster at one row, the matmuls at many (docs/numerics.md, "The fast op set's switches")."""


class PackedLinear:
    """y = x @ weight.T for x [..., in], on the faster CPU GEMM per call.

    torch's fp32 ``F.linear`` on CPU calls MKL's sgemm, which on some CPUs takes a generic path
    for a batched decode step's multi-row matmuls; oneDNN with the weight reordered once into its
    blocked layout can run those ~1.5-2x faster, but pays a fixed cost per call, and elsewhere
    MKL's small-matrix path wins (docs/numerics.md, "The fast op set's switches"). So where the
    switch pays is a fact of the machine: ``onednn_from_rows`` measures it once per process and
    matrix shape. Both sum in their own orders: outputs agree to float rounding, not
    bit for bit (this is the fast op set). oneDNN is used only for CPU fp32 tensors with mkldnn
    built in; elsewhere this is plain ``F.linear``. The packed copy doubles the matrix's memory."""

    __slots__ = ("weight", "packed", "min_rows")

    def __init__(self, weight: torch.Tensor):
        self.weight = weight
        self.packed = pack_for_onednn(weight) if onednn_usable(weight) else None
        self.min_rows = None if self.packed is None else onednn_from_rows(*weight.shape)
        """Rows per call from which oneDNN runs (None: MKL always)."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.min_rows is not None and x.numel() // x.shape[-1] >= self.min_rows:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")
        return F.linear(x, self.weight)


@functools.lru_cache(maxsize=None)
def onednn_from_rows(out_dim: int, in_dim: int) -> int | None:
    """The first of CALIBRATION_ROWS at which oneDNN's packed fp32 linear of an [out, in] matrix
    beats MKL by ONEDNN_MARGIN on this machine at this thread count, or None. ~10-40 ms per
    shape, once per process (the fast op set has no bitwise promise, so a choice by timing is
    fine here; the deterministic op set never chooses by timing)."""
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(out_dim, in_dim, generator=g)
    packed = pack_for_onednn(weight)

    def best_us(fn, x) -> float:
        fn(x)
        times = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(3):
                fn(x)
            times.append(time.perf_counter() - start)
        return min(times) / 3 * 1e6

    def onednn(v):
        return torch.ops.mkldnn._linear_pointwise(v, packed, None, "none", [], "")

    with torch.no_grad():
        for rows in CALIBRATION_ROWS:
            x = torch.randn(rows, in_dim, generator=g)
            if best_us(onednn, x) <= ONEDNN_MARGIN * best_us(lambda v: F.linear(v, weight), x):
                return rows
    return None


class FastOps(CpuOps):
    name = "fast"

    def prepare(self, matrix: torch.Tensor) -> PackedLinear:
        return PackedLinear(matrix.detach())

    def stacked_moe(self, trainable: bool) -> bool:
        return False

    def rms_norm(self, x, weight, eps):
        return F.rms_norm(x, x.shape[-1:], weight, eps)

    def silu_mul(self, gate, up):
        return F.silu(gate) * up

    def attention_context(self, positions, plan, cache, t):
        if plan is None:
            raise ValueError("the fast op set serves the KV-cached forward only (the module "
                             "forward is the fast path without a cache)")
        return plan

    def self_attention(self, qkv, qk_norm, cos, sin, plan, kv, w):
        b, t = qkv.shape[:2]
        q, k, v = self.rotate_qk(qkv, qk_norm, cos, sin, w)
        k, v = plan.through_cache(*kv, k, v)
        if t == 1:
            out = _decode_attention(q.select(1, 0), k, v, plan.mask)
        else:
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2), k, v, attn_mask=plan.mask, is_causal=plan.causal_new and t > 1,
                scale=1.0, enable_gqa=True,
            ).transpose(1, 2)
        return out.reshape(b, t, w.heads * w.head_dim)

    def moe(self, layer, h, replay, w):
        return sparse_moe(layer, h, w.top_k, w.norm_topk_prob, replay, self.silu_mul)


def _decode_attention(q, k, v, mask) -> torch.Tensor:
    """One query per row at scale 1: q [B, heads, D], k/v [B, kv_heads, L, D], mask [B, 1, 1, L]
    | None -> [B, 1, heads, D]. The q heads sharing a kv head are that kv head's queries (a
    [group, D] @ [D, L] product, no repeat_kv copy)."""
    b, heads, d = q.shape
    kv_heads = k.shape[1]
    q = q.reshape(b, kv_heads, heads // kv_heads, d)
    if b < MATMUL_ATTENTION_MIN_ROWS:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)
        return out.view(b, 1, heads, d)
    scores = torch.matmul(q, k.transpose(-1, -2))  # [B, kv_heads, group, L]
    if mask is not None:
        scores = scores.masked_fill_(~mask, float("-inf"))
    return torch.matmul(scores.softmax(-1), v).view(b, 1, heads, d)
