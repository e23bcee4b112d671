"""Batch-invariant matmuls in Triton: dense ``linear`` and the MoE ``grouped_linear``.

Why this route: cuBLAS picks its algorithm (tile shape, split-K, stream-K) from the problem size,
so the number of rows changes the order in which an output element's K products are summed, and
with it the bits. Following Thinking Machines' batch_invariant_ops, these kernels use ONE tile
configuration for every shape and never split K: each output element is owned by one program
that walks K from 0 upward in ``BLOCK_K`` steps, accumulating in fp32 with ``tl.dot``. Its
reduction order is a function of K alone, so row r of ``x @ w.T`` has the same bits whether x has
1 row (decode) or 20,000 (the trainer's forward), and whichever rows share its tile.

The grouped kernel serves the MoE experts: (token, expert) assignments are sorted by expert and
each expert's run padded to whole ``BLOCK_M`` tiles (``align_by_expert``, torch ops with no host
sync, routing.py), so every tile multiplies rows by one expert's weights. Again one config, no split-K.

Speed notes: for decode (M <= 64) the work is a read of the weights; without split-K the grid is
``N / BLOCK_N`` programs per 64 rows, which is why BLOCK_N is 64 rather than 128.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_M = 64
BLOCK_N = 64
BLOCK_K = 64
NUM_WARPS = 4
NUM_STAGES = 3
"""The one tile configuration (never chosen per shape: that is what makes the kernels invariant).
The row count M is also kept out of Triton's specialisation (it would otherwise compile a
separate kernel for M == 1 and for M divisible by 16)."""


@triton.jit(do_not_specialize=["M"])
def _matmul_kernel(x_ptr, w_ptr, out_ptr, rows_ptr, block_expert_ptr, M, N, K,
                   stride_xm, stride_we, stride_wn, stride_om, GROUPED: tl.constexpr,
                   ROW_DIV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr):
    """out[rows, cols] = x[src rows] @ w[cols].T, walking K from 0 in BLOCK_K steps.

    Dense (GROUPED=False): tile ``program_id(0)`` is rows tile*BLOCK_M.. of x and out (< M).
    Grouped: the tile holds up to BLOCK_M assignment ids (``rows_ptr``, -1 = padding), all for
    expert ``block_expert_ptr[tile]`` (-1 = unused tile, nothing loaded or stored); assignment
    a reads x row a // ROW_DIV (its token, or itself) with expert weights w[e] and writes row a.
    One kernel for both (not a shared helper: Triton 3.6's interpreter, which the CPU tests
    use, loses its patched builtins in nested jit calls when run after other tests)."""
    tile = tl.program_id(0)
    if GROUPED:
        expert = tl.load(block_expert_ptr + tile)
        used = expert >= 0
        w_base = w_ptr + tl.maximum(expert, 0).to(tl.int64) * stride_we
        assignment = tl.load(rows_ptr + tile * BLOCK_M + tl.arange(0, BLOCK_M))
        row_ok = (assignment >= 0) & used
        src = tl.where(row_ok, assignment // ROW_DIV, 0).to(tl.int64)
        dst = tl.where(row_ok, assignment, 0).to(tl.int64)
    else:
        used = tile >= 0
        w_base = w_ptr
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < M
        src = rows.to(tl.int64)
        dst = src
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = (cols < N) & used
    x_rows = x_ptr + src[:, None] * stride_xm
    w_cols = w_base + cols.to(tl.int64)[None, :] * stride_wn
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + ks
        a = tl.load(x_rows + k[None, :], mask=row_ok[:, None] & (k[None, :] < K), other=0.0)
        b = tl.load(w_cols + k[:, None], mask=col_ok[None, :] & (k[:, None] < K), other=0.0)
        acc = tl.dot(a, b, acc)
    out = out_ptr + dst[:, None] * stride_om + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def linear(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x [M, K] @ weight [N, K].T -> [M, N] in out_dtype (default x.dtype), fp32 accumulation."""
    x = x.contiguous()
    m, k = x.shape
    n = weight.shape[0]
    assert weight.shape[1] == k and weight.stride(1) == 1, "weight must be [N, K], K contiguous"
    out = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    if m == 0:
        return out
    grid = (triton.cdiv(m, BLOCK_M), triton.cdiv(n, BLOCK_N))
    _matmul_kernel[grid](x, weight, out, x, x, m, n, k, x.stride(0), 0, weight.stride(0),
                         out.stride(0), GROUPED=False, ROW_DIV=1, BLOCK_M=BLOCK_M,
                         BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, num_warps=NUM_WARPS,
                         num_stages=NUM_STAGES)
    return out


def grouped_linear(x: torch.Tensor, weights: torch.Tensor, rows: torch.Tensor,
                   block_expert: torch.Tensor, num_assignments: int, row_div: int) -> torch.Tensor:
    """out[a] = x[a // row_div] @ weights[expert of a].T for every assignment a -> [A, N].

    weights [E, N, K]; rows/block_expert from ``routing.align_by_expert(ids, E, BLOCK_M)``."""
    x = x.contiguous()
    _, n, k = weights.shape
    assert weights.stride(2) == 1, "expert weights must be [E, N, K], K contiguous"
    out = torch.empty((num_assignments, n), dtype=x.dtype, device=x.device)
    if num_assignments == 0:
        return out
    grid = (block_expert.numel(), triton.cdiv(n, BLOCK_N))
    _matmul_kernel[grid](x, weights, out, rows, block_expert, num_assignments, n, k,
                         x.stride(0), weights.stride(0), weights.stride(1), out.stride(0),
                         GROUPED=True, ROW_DIV=row_div, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                         BLOCK_K=BLOCK_K, num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    return out
