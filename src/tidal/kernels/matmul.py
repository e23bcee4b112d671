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
def _matmul_kernel(x_ptr, w_ptr, out_ptr, rows_ptr, block_expert_ptr, res_ptr, M, N, K,
                   stride_xm, stride_we, stride_wn, stride_om, GROUPED: tl.constexpr,
                   ROW_DIV: tl.constexpr, SWIGLU: tl.constexpr, RESIDUAL: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[rows, cols] = x[src rows] @ w[cols].T, walking K from 0 in BLOCK_K steps.

    Dense (GROUPED=False): tile ``program_id(0)`` is rows tile*BLOCK_M.. of x and out (< M).
    Grouped: the tile holds up to BLOCK_M assignment ids (``rows_ptr``, -1 = padding), all for
    expert ``block_expert_ptr[tile]`` (-1 = unused tile, nothing loaded or stored); assignment
    a reads x row a // ROW_DIV (its token, or itself) with expert weights w[e] and writes row a.
    SWIGLU: x rows are [gate | up] (2K wide) and the A operand is silu(gate) * up, each step
    rounded to x's dtype as torch's two elementwise ops do. RESIDUAL: out = res + the product
    rounded to out's dtype (torch's ``res + x @ w.T``). One kernel for both (not a shared helper: Triton 3.6's interpreter, which the CPU tests
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
        a_ok = row_ok[:, None] & (k[None, :] < K)
        a = tl.load(x_rows + k[None, :], mask=a_ok, other=0.0)
        if SWIGLU:
            g = a.to(tl.float32)
            up = tl.load(x_rows + K + k[None, :], mask=a_ok, other=0.0)
            act = (g / (1.0 + tl.exp(-g))).to(a.dtype)
            a = (act.to(tl.float32) * up.to(tl.float32)).to(a.dtype)
        b = tl.load(w_cols + k[:, None], mask=col_ok[None, :] & (k[:, None] < K), other=0.0)
        acc = tl.dot(a, b, acc)
    out_ok = row_ok[:, None] & col_ok[None, :]
    y = acc.to(out_ptr.dtype.element_ty)
    if RESIDUAL:
        res = tl.load(res_ptr + dst[:, None] * stride_om + cols[None, :], mask=out_ok, other=0.0)
        y = (res.to(tl.float32) + y.to(tl.float32)).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + dst[:, None] * stride_om + cols[None, :], y, mask=out_ok)


def linear(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype | None = None,
           residual: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ weight [N, K].T -> [M, N] in out_dtype (default x.dtype), fp32 accumulation;
    plus ``residual`` [M, N] (same dtype as the output) when given, in the same launch."""
    x = x.contiguous()
    m, k = x.shape
    n = weight.shape[0]
    assert weight.shape[1] == k and weight.stride(1) == 1, "weight must be [N, K], K contiguous"
    out = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    if m == 0:
        return out
    grid = (triton.cdiv(m, BLOCK_M), triton.cdiv(n, BLOCK_N))
    if residual is not None:
        residual = residual.contiguous()
        assert residual.shape == out.shape and residual.dtype == out.dtype
    _matmul_kernel[grid](x, weight, out, x, x, out if residual is None else residual, m, n, k,
                         x.stride(0), 0, weight.stride(0), out.stride(0), GROUPED=False,
                         ROW_DIV=1, SWIGLU=False, RESIDUAL=residual is not None, BLOCK_M=BLOCK_M,
                         BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, num_warps=NUM_WARPS,
                         num_stages=NUM_STAGES)
    return out


def grouped_linear(x: torch.Tensor, weights: torch.Tensor, rows: torch.Tensor,
                   block_expert: torch.Tensor, num_assignments: int, row_div: int,
                   swiglu: bool = False) -> torch.Tensor:
    """out[a] = x[a // row_div] @ weights[expert of a].T for every assignment a -> [A, N];
    with ``swiglu`` x is [gate | up] (2K wide) and the product is silu(gate) * up @ w.T.

    weights [E, N, K]; rows/block_expert from ``routing.align_by_expert(ids, E, BLOCK_M)``."""
    x = x.contiguous()
    _, n, k = weights.shape
    assert x.shape[1] == (2 * k if swiglu else k)
    assert weights.stride(2) == 1, "expert weights must be [E, N, K], K contiguous"
    out = torch.empty((num_assignments, n), dtype=x.dtype, device=x.device)
    if num_assignments == 0:
        return out
    grid = (block_expert.numel(), triton.cdiv(n, BLOCK_N))
    _matmul_kernel[grid](x, weights, out, rows, block_expert, out, num_assignments, n, k,
                         x.stride(0), weights.stride(0), weights.stride(1), out.stride(0),
                         GROUPED=True, ROW_DIV=row_div, SWIGLU=swiglu, RESIDUAL=False,
                         BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                         BLOCK_K=BLOCK_K, num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    return out
