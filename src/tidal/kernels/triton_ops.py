"""The deterministic GPU op set of the one fused forward (model/fused.py; the seam's contract is
numerics/opset.py): every step on the batch-invariant Triton kernels, so the engine (KV cache,
any batch, decode or chunked prefill) and the trainer (full sequences, no cache) give a token
the same bits.

    seam step           kernel(s)                                       file
    linear              fixed-tile matmul, no split-K (+ residual)      matmul.py
    norm                one program per row (weighted or folded form)   rowwise.py
    self_attention      qkv_to_cache: q/k norm (Llama: scale only) +    fused.py
                        RoPE + cache write;
                        attention over the cache, fixed 64-key blocks   attention.py
    moe                 router matmul; route (softmax, top-k or replay, matmul.py, fused.py
                        gates); align_by_expert; grouped_linear x 2
                        (SwiGLU fused into the second); combine

The fused forward keeps hidden states [B, T, H]; the kernels take token rows [B*T, ...], so
each op flattens, and ``attention_context`` derives every token's cache (slot, position) once
per forward: from the CachePlan (engine) or, for the trainer's forward without a cache, row b's
column t, written into a scratch cache [B, kv_heads, T, D] shared by the layers (each layer
writes every entry before it reads). Prefill, decode and the trainer thus write K/V to a cache
and run the same attention kernel. Padding (position < 0) writes nothing and attends to key 0.

Fused layout conventions (model/fused.py): fp32 folds the norm weights (and sqrt(width)) into
the matrices after them, so the norms run in the folded form x / sqrt(sum x^2 + n * eps); bf16
applies the weights itself; q's norm weight carries the attention scale, so attention runs at
scale 1. The kernels take the per-head norm weights [heads + kv_heads, D] and each token's rows
of model/rope.py's table (cos, sign-folded sin). Matrices need no other layout: ``prepare``
returns them as they are (contiguous).

Inference only (``trainable = False``: the kernels have no backward); the trainer's
deterministic forward on a GPU recomputes the engine's logprobs under no_grad. The sampling
logprob that goes with this op set is ``log_softmax`` (rowwise.py, row-invariant).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tidal.kernels import attention, fused, matmul, rowwise


@dataclass
class TokenRows:
    """One forward's token rows, built once and used by every layer."""

    slot: torch.Tensor  # [N] cache slot of each token (row-major over [B, T])
    pos: torch.Tensor  # [N] cache position (< 0: padding, not written)
    attend: torch.Tensor  # [N] last key each query attends to (pos, padding clamped to 0)
    shape: tuple[int, int]  # (B, T)
    scratch: tuple[torch.Tensor, torch.Tensor] | None = None  # the no-cache forward's K/V
    rope: tuple | None = None  # (cos given, cos rows [N, D], sin rows [N, D]) of this forward


class TritonOps:
    """Deterministic mode on the Triton kernels (see the module docstring)."""

    name = "deterministic"
    trainable = False

    def prepare(self, matrix: torch.Tensor) -> torch.Tensor:
        return matrix.detach().contiguous()

    def stacked_moe(self, trainable: bool) -> bool:
        return False

    def attention_context(self, positions, plan, cache, t) -> TokenRows:
        b = positions.shape[0]
        device = positions.device
        if plan is None:  # the trainer: row b, column t at (slot b, position t)
            slot = torch.arange(b, device=device).repeat_interleave(t)
            pos = torch.arange(t, device=device).repeat(b)
            return TokenRows(slot, pos, pos, (b, t))
        rows = plan.rows
        if isinstance(rows, slice):
            rows = torch.arange(rows.start, rows.stop, device=device)
        pos = positions.reshape(-1)
        return TokenRows(rows.repeat_interleave(t), pos, pos.clamp(min=0), (b, t))

    def linear(self, prepared: torch.Tensor, x: torch.Tensor,
               residual: torch.Tensor | None = None) -> torch.Tensor:
        n = prepared.shape[0]
        flat = x.reshape(-1, x.shape[-1])
        res = None if residual is None else residual.reshape(-1, n)
        return matmul.linear(flat, prepared, residual=res).view(*x.shape[:-1], n)

    def norm(self, x: torch.Tensor, weight: torch.Tensor | None, w) -> torch.Tensor:
        if weight is None:  # folded (fp32): x / sqrt(sum x^2 + H * eps)
            return rowwise.rms_norm(x, None, w.eps * x.shape[-1], folded=True)
        return rowwise.rms_norm(x, weight, w.eps)

    def silu_mul(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return F.silu(gate) * up  # elementwise: one rounding per element, whatever the tensor

    def self_attention(self, qkv, qk_norm, cos, sin, ctx: TokenRows, kv, w) -> torch.Tensor:
        b, t = ctx.shape
        d = w.head_dim
        cos_rows, sin_rows = _rope_rows(ctx, cos, sin, d)
        if kv is None:
            if ctx.scratch is None:
                shape = (b, w.kv_heads, t, d)
                ctx.scratch = (qkv.new_empty(shape), qkv.new_empty(shape))
            kv = ctx.scratch
        k_cache, v_cache = kv
        eps, width_div = (w.eps * d, 1.0) if w.folded else (w.eps, float(d))
        q = fused.qkv_to_cache(qkv.reshape(b * t, -1), qk_norm.contiguous(), cos_rows, sin_rows,
                               k_cache, v_cache, ctx.slot, ctx.pos,
                               (w.heads, w.kv_heads, d), eps, width_div, normed=w.qk_normed)
        out = attention.attention(q, k_cache, v_cache, ctx.slot, ctx.attend, 1.0)
        return out.view(b, t, w.heads * d)

    def moe(self, layer, h, replay, w):
        flat = h.reshape(-1, h.shape[-1])
        logits = matmul.linear(flat, layer.router)
        ids, gates, own = fused.route(logits, w.top_k, w.norm_topk_prob, replay)
        out = self.experts(flat, ids, gates, layer.experts_gate_up_weight.contiguous(),
                           layer.experts_down_weight.contiguous())
        return out.view_as(h), own

    def experts(self, x, ids, gates, gate_up, down, residual=None) -> torch.Tensor:
        """(residual +) x [M, H] through experts ids [M, k] with gates [M, k] -> [M, H]: each
        (token, expert) assignment's MLP on its own row (grouped GEMMs over expert-aligned
        tiles), the k outputs combined in top-k order in fp32. gate_up [E, 2I, H], down [E, H, I]."""
        k = ids.shape[1]
        flat = ids.reshape(-1)
        rows, blocks = fused.align_by_expert(flat, gate_up.shape[0], matmul.BLOCK_M)
        hidden = matmul.grouped_linear(x, gate_up, rows, blocks, flat.numel(), row_div=k)
        y = matmul.grouped_linear(hidden, down, rows, blocks, flat.numel(), row_div=1, swiglu=True)
        return fused.combine(y, gates, residual)

    @staticmethod
    def log_softmax(logits: torch.Tensor) -> torch.Tensor:
        """fp32 log-probabilities over the last dim, one program per row: the sampling logprob
        of this op set's engine and trainer (torch's kernel picks its reduction by shape)."""
        return rowwise.softmax(logits, log=True)


def _rope_rows(ctx: TokenRows, cos, sin, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward's RoPE (model/fused.py ``_rope``: [T, 1, D] or [B, T, 1, D], the same for
    every layer) as one row per token [N, D], made once per forward."""
    if ctx.rope is None or ctx.rope[0] is not cos:
        b, t = ctx.shape
        rows = tuple(torch.broadcast_to(x, (b, t, 1, d)).reshape(b * t, d).contiguous()
                     for x in (cos, sin))
        ctx.rope = (cos, *rows)
    return ctx.rope[1], ctx.rope[2]
