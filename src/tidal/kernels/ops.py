"""The two op sets the MoE forward runs on: ``FastOps`` (plain torch) and ``DeterministicOps``.

    ops = make_ops("deterministic", device)   # Triton kernels on CUDA, pure torch elsewhere
    ops = make_ops("fast", device)            # cuBLAS matmuls, flash / memory-efficient SDPA

Both take flat token rows (no padding): ``attention`` gets each query's cache slot and position
and, for whole sequences starting at position 0 (prefill, the trainer's forward), their lengths
``seg_lens``; for decode (one token per slot) ``seg_lens`` is None.

FastOps is the benchmark's peer, so it is what a reasonably tuned torch engine and trainer run,
with no host sync in a decode step: matmuls pick their cuBLAS algorithm by shape; prefill and the
trainer's forward are one causal flash-attention call over the right-padded sequences; decode is
one memory-efficient SDPA call of each KV head's query group against the cache; RMSNorm is
torch's fused op; experts are grouped GEMMs over the tokens sorted by expert, summed back with
``index_add_`` (atomics on the GPU). Each is correct; none is batch-invariant.
SDPA's cuDNN backend is left out (``FAST_BACKENDS``): torch >= 2.9 prefers it on Hopper, and it
builds an execution plan for every new shape (tens of ms each) -- in a decode loop the key
length grows every step, so every step paid a plan build (the first H200 run: fast mode at
62 tok/s on the smoke model, 20x slower than the deterministic kernels).

DeterministicOps routes every reduction through an op whose order is fixed per row (see
matmul.py, rowwise.py, attention.py; reference.py on the CPU): prefill, decode and the trainer's
forward all write K/V to a cache and run the same attention kernel; expert outputs are combined
in top-k order with elementwise ops.
"""

from __future__ import annotations

import math
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from tidal.kernels import reference
from tidal.kernels.routing import sort_by_expert

MODES = ("fast", "deterministic")
FAST_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
"""SDPA backends FastOps allows, best first (no cuDNN: a plan build per new shape, see above)."""


class FastOps:
    """What a reasonably tuned plain-torch engine runs (see the module docstring)."""

    name = "fast"

    def __init__(self):
        self.grouped_mm = hasattr(torch, "_grouped_mm")
        """Use ``torch._grouped_mm`` for the experts; cleared (with a printed reason) the first
        time it fails or disagrees with the padded batched matmul."""

    @property
    def experts_path(self) -> str:
        """Which expert compute ran: "grouped_mm" (checked), "padded_bmm", or "unused"."""
        return {"checked": "grouped_mm", False: "padded_bmm"}.get(self.grouped_mm, "unused")

    def linear(self, x, weight, out_dtype=None, residual=None):
        out = F.linear(x, weight)
        out = out if out_dtype is None else out.to(out_dtype)
        return out if residual is None else residual + out

    def rope_at(self, table, pos, dtype):
        return rope_rows(table, pos, dtype)

    def self_attention(self, qkv, q_norm, k_norm, rope, cache_k, cache_v, slot, pos, seg_lens,
                       span, heads, eps):
        return unfused_self_attention(self, qkv, q_norm, k_norm, rope, cache_k, cache_v, slot,
                                      pos, seg_lens, span, heads, eps)

    def route(self, logits, k, norm, replay):
        return unfused_route(self, logits, k, norm, replay)

    def rms_norm(self, x, weight, eps):
        return F.rms_norm(x, weight.shape, weight, eps)  # one fused kernel on CUDA

    def softmax(self, x, log):
        return torch.log_softmax(x.float(), -1) if log else torch.softmax(x.float(), -1)

    def silu_mul(self, gate, up):
        return F.silu(gate) * up

    def normalize_gates(self, weights):
        return weights / weights.sum(-1, keepdim=True)

    def attention(self, q, k, v, cache_k, cache_v, slot, pos, seg_lens, span, scale):
        """q [N, Hq, D], k/v [N, Hkv, D] (written to the caches first) -> [N, Hq, D]."""
        write_cache(cache_k, cache_v, k, v, slot, pos)
        if seg_lens is not None:
            return causal_attention(q, k, v, pos, len(seg_lens), max(seg_lens), scale)
        return decode_attention(q, cache_k, cache_v, slot, pos, span, scale)

    def experts(self, x, ids, weights, gate_up, down, residual=None):
        """(residual +) x [M, H], ids/weights [M, k] -> [M, H]: assignments sorted by expert, one grouped
        matmul per projection (``torch._grouped_mm``, as torchtitan's MoE does; a padded batched
        matmul where that is missing or fails), summed back with index_add_ (atomics on the GPU)."""
        k = ids.shape[1]
        order, sorted_ids, counts, rank = sort_by_expert(ids.reshape(-1), gate_up.shape[0])
        token = order // k
        weight = weights.reshape(-1)[order].to(x.dtype)[:, None]
        y = None
        if self.grouped_mm and (x.device.type == "cpu" or x.dtype == torch.bfloat16):
            y = self._grouped_or_none(x[token], counts, sorted_ids, rank, gate_up, down)
        if y is None:
            y = self._padded(x[token], counts, sorted_ids, rank, gate_up, down)
        out = torch.zeros_like(x).index_add_(0, token, y * weight)
        return out if residual is None else residual + out

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


def causal_attention(q, k, v, pos, segments: int, longest: int, scale):
    """Whole sequences from position 0 laid end to end (q [N, Hq, D], k/v [N, Hkv, D], pos [N])
    -> [N, Hq, D]: right-padded to [segments, longest] and one causal flash-attention call
    (padding sits after each sequence, so causality keeps it out of every real query)."""
    seg = torch.cumsum(pos == 0, 0) - 1  # each token's sequence, from the data: no host sync
    group = q.shape[1] // k.shape[1]

    def padded(t):
        out = t.new_zeros((segments, longest, *t.shape[1:]))
        out[seg, pos] = t
        return out.transpose(1, 2)  # [B, heads, T, D]

    keys = padded(k).repeat_interleave(group, 1)
    values = padded(v).repeat_interleave(group, 1)
    with sdpa_kernel(FAST_BACKENDS):
        out = F.scaled_dot_product_attention(padded(q), keys, values, is_causal=True, scale=scale)
    return out.transpose(1, 2)[seg, pos]


def decode_attention(q, cache_k, cache_v, slot, pos, span, scale):
    """One query per slot against its cache: each KV head's query group as a length-``group``
    query block (no K/V repeat), keys past the row's position masked -> [N, Hq, D]."""
    n, hq, d = q.shape
    hkv = cache_k.shape[1]
    keys, values = cache_k[slot, :, :span], cache_v[slot, :, :span]  # [N, Hkv, span, D]
    mask = torch.arange(span, device=q.device)[None, :] <= pos[:, None]  # [N, span]
    with sdpa_kernel(FAST_BACKENDS):
        out = F.scaled_dot_product_attention(q.reshape(n, hkv, hq // hkv, d), keys, values,
                                             attn_mask=mask[:, None, None, :], scale=scale)
    return out.reshape(n, hq, d)


class DeterministicOps:
    """Batch-invariant ops: Triton kernels when ``use_triton`` (CUDA), else reference.py.
    On Triton, fused.py's kernels replace the torch glue between the kernels (fewer launches
    per decode step): q/k norm + RoPE + cache write, routing, expert alignment and combine."""

    name = "deterministic"

    def __init__(self, use_triton: bool):
        self.use_triton = use_triton
        if use_triton:
            from tidal.kernels import attention, fused, matmul, rowwise

            self._linear, self._attention = matmul.linear, attention.attention
            self._rms_norm, self._softmax = rowwise.rms_norm, rowwise.softmax
            self._matmul, self._fused = matmul, fused
        else:
            self._linear, self._attention = reference.linear, reference.attention
            self._rms_norm, self._softmax = reference.rms_norm, reference.softmax

    def linear(self, x, weight, out_dtype=None, residual=None):
        if self.use_triton:
            return self._linear(x, weight, out_dtype, residual)
        out = self._linear(x, weight, out_dtype)
        return out if residual is None else residual + out

    def rms_norm(self, x, weight, eps):
        return self._rms_norm(x, weight, eps)

    def softmax(self, x, log):
        return self._softmax(x, log)

    def silu_mul(self, gate, up):
        # elementwise: one rounding per element whatever the tensor (on the CPU, SIMD-uniform)
        return F.silu(gate) * up if self.use_triton else reference.silu_mul(gate, up)

    def normalize_gates(self, weights):
        return weights / ordered_sum(weights.unbind(-1))[..., None]

    def rope_at(self, table, pos, dtype):
        """Triton: the fp32 tables themselves (the fused kernel looks up each row's position)."""
        return table if self.use_triton else rope_rows(table, pos, dtype)

    def self_attention(self, qkv, q_norm, k_norm, rope, cache_k, cache_v, slot, pos, seg_lens,
                       span, heads, eps):
        if not self.use_triton:
            return unfused_self_attention(self, qkv, q_norm, k_norm, rope, cache_k, cache_v,
                                          slot, pos, seg_lens, span, heads, eps)
        q = self._fused.qkv_to_cache(qkv, q_norm, k_norm, *rope, cache_k, cache_v, slot, pos,
                                     heads, eps)
        return self._attention(q, cache_k, cache_v, slot, pos, 1.0 / math.sqrt(heads[2]))

    def route(self, logits, k, norm, replay):
        if self.use_triton:
            return self._fused.route(logits, k, norm, replay)
        return unfused_route(self, logits, k, norm, replay)

    def attention(self, q, k, v, cache_k, cache_v, slot, pos, seg_lens, span, scale):
        write_cache(cache_k, cache_v, k, v, slot, pos)
        return self._attention(q, cache_k, cache_v, slot, pos, scale)

    def experts(self, x, ids, weights, gate_up, down, residual=None):
        """(residual +) per-assignment expert MLPs (each row on its own), combined in top-k
        order in fp32."""
        m, k = ids.shape
        inter = down.shape[2]
        flat = ids.reshape(-1)
        if self.use_triton:
            mm, fused = self._matmul, self._fused
            rows, blocks = fused.align_by_expert(flat, gate_up.shape[0], mm.BLOCK_M)
            h = mm.grouped_linear(x, gate_up, rows, blocks, flat.numel(), row_div=k)
            y = mm.grouped_linear(h, down, rows, blocks, flat.numel(), row_div=1, swiglu=True)
            return fused.combine(y, weights, residual)
        token = torch.arange(m, device=x.device).repeat_interleave(k)
        h = reference.grouped_linear(x[token], gate_up, flat)
        act = self.silu_mul(h[:, :inter], h[:, inter:])
        y = reference.grouped_linear(act, down, flat)
        y = y.view(m, k, -1).float() * weights.float()[..., None]
        out = ordered_sum(y.unbind(1)).to(x.dtype)
        return out if residual is None else residual + out


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF's x * cos + rotate_half(x) * sin; x [N, heads, D], cos/sin [N, 1, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def rope_rows(table, pos, dtype):
    """RoPE cos/sin tables [L, D] fp32 -> the rows at ``pos`` in ``dtype``, [N, 1, D] each."""
    cos, sin = table
    return cos[pos].to(dtype)[:, None, :], sin[pos].to(dtype)[:, None, :]


def unfused_self_attention(ops, qkv, q_norm, k_norm, rope, cache_k, cache_v, slot, pos,
                           seg_lens, span, heads, eps):
    """qkv [N, (Hq + 2 Hkv) D] -> attention output [N, Hq, D] with torch glue: q/k RMSNorm,
    RoPE (``rope``: rope_rows' cos/sin), then ``ops.attention`` (which writes k/v to the cache)."""
    hq, hkv, d = heads
    n = qkv.shape[0]
    cos, sin = rope
    q, k, v = qkv.split((hq * d, hkv * d, hkv * d), dim=-1)
    q = apply_rope(ops.rms_norm(q.reshape(n, hq, d), q_norm, eps), cos, sin)
    k = apply_rope(ops.rms_norm(k.reshape(n, hkv, d), k_norm, eps), cos, sin)
    return ops.attention(q, k, v.reshape(n, hkv, d), cache_k, cache_v, slot, pos, seg_lens,
                         span, 1.0 / math.sqrt(d))


def unfused_route(ops, logits, k, norm, replay):
    """Router logits [N, E] -> (ids [N, k]: top-k or ``replay``; gates [N, k] fp32: softmax
    probabilities at ids, renormalised by ``ops.normalize_gates`` when ``norm``)."""
    probs = ops.softmax(logits, log=False)
    ids = torch.topk(probs, k, dim=-1).indices if replay is None else replay
    gates = probs.gather(-1, ids)
    return ids, ops.normalize_gates(gates) if norm else gates


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
