"""The seam of the one fused forward (model/fused.py): an op set. The forward's math is written
once; what differs between fast serving, deterministic (batch-invariant) inference and training,
and the GPU is only which kernels run each step:

    op set              linear                      attention                  where
    FastOps             MKL or packed oneDNN by     SDPA / two matmuls on       numerics/fast.py
                        size (PackedLinear)         cache views
    DeterministicOps    the probed invariant path   fixed key blocks, fixed     numerics/deterministic.py
                        (DeterministicLinear)       order (ops.attention)
    TritonOps           batch-invariant Triton      Triton kernel over the      kernels/triton_ops.py
                        GEMMs                       cache (a scratch one
                                                    for the trainer)
    FastGpuOps          cuBLAS                      SDPA on the cache           kernels/fast_ops.py

On CUDA tensors (or with TIDAL_OPS=gpu: numerics.ops_backend) make_ops gives the last two.

An op set provides:

    name                                  "fast" | "deterministic" (recorded with results)
    trainable                             whether the forward may run with autograd
    prepare(matrix [out, in]) -> linear   a callable y = x @ matrix.T, built once per weights
    stacked_moe(trainable) -> bool        build numerics/moe.py's few-token stacked matrices
    attention_context(positions, plan, cache, t) -> ctx     once per forward
    linear(prepared, x, residual=None)    residual + x @ W.T
    norm(x, weight | None, w)             RMSNorm over the hidden size (None: folded, see below)
    self_attention(qkv, qk_norm, cos, sin, ctx, kv, w) -> [B, T, heads * D]
                                          q/k norms (or, without them, only the
                                          multiplier), RoPE, cache write, attention
    silu_mul(gate, up)
    moe(layer, h, replay, w) -> (out, own top-k)

``w`` is the forward's weights (model/fused.py ``FusedWeights``: heads, kv_heads, head_dim, eps,
hidden_eps, head_eps, folded, qk_normed, top_k, norm_topk_prob). Folded norms (fp32): the RMSNorm
weight and sqrt(width) live in the next matmul, the norm is x / sqrt(sum x^2 + width * eps)
(``ops.folded_rms_norm``); q's sqrt(D) cancels the attention scale, so every op set attends at
scale 1 (bf16 keeps RMSNorm's exact form and carries 1/sqrt(D) in q's norm weight). A model
without q/k norms (Llama: ``w.qk_normed`` False) has the multiplier only: 1/sqrt(D) on q, 1 on k.
"""

from __future__ import annotations

import torch

from tidal.numerics.ops import apply_rope_fused, folded_rms_norm


class CpuOps:
    """What the CPU op sets share: residual adds, the q/k norm + RoPE step."""

    name = "cpu"
    trainable = False

    def linear(self, prepared, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        out = prepared(x)
        return out if residual is None else residual + out

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
        raise NotImplementedError

    def norm(self, x: torch.Tensor, weight: torch.Tensor | None, w) -> torch.Tensor:
        if weight is None:
            return folded_rms_norm(x, w.hidden_eps)
        return self.rms_norm(x, weight, w.eps)

    def rotate_qk(self, qkv: torch.Tensor, qk_norm: torch.Tensor, cos, sin, w):
        """qkv [B, T, heads + 2 kv_heads, D] -> q [B, T, heads, D], k, v [B, T, kv_heads, D]:
        q_norm / k_norm as one norm over all q and k heads (times the per-head weight), RoPE.
        Without q/k norms (Llama) q and k are only multiplied by qk_norm (the attention scale)."""
        heads, kv_heads = w.heads, w.kv_heads
        qk = qkv.narrow(2, 0, heads + kv_heads)
        if not w.qk_normed:
            qk = qk * qk_norm
        elif w.folded:
            qk = folded_rms_norm(qk, w.head_eps) * qk_norm
        else:
            qk = self.rms_norm(qk, None, w.eps) * qk_norm
        qk = apply_rope_fused(qk, cos, sin)
        return qk.narrow(2, 0, heads), qk.narrow(2, heads, kv_heads), qkv.narrow(2, heads + kv_heads, kv_heads)
