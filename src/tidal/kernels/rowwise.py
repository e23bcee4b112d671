"""Row-wise Triton kernels with one program per row: RMSNorm and (log-)softmax.

A row's reduction (sum of squares, max and sum of exponentials) runs inside the one program that
owns the row, in a fixed order set by the row's width alone: chunks of a fixed size walked left
to right, each reduced by ``tl.sum``/``tl.max`` over the same layout. How many rows the call has
changes only the grid, never a row's arithmetic.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

SOFTMAX_CHUNK = 2048
"""Columns per step of the softmax's online max/sum (a constant: never chosen per row count)."""


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, width, stride_x, stride_o, eps, width_div,
                     HAS_WEIGHT: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < width
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0)
    h = x.to(tl.float32)
    mean_sq = tl.sum(h * h, axis=0) / width_div
    h = h * (1.0 / tl.sqrt_rn(mean_sq + eps))
    y = h.to(x.dtype)
    if HAS_WEIGHT:
        # transformers: weight * h.to(input dtype), the product in the input dtype
        w = tl.load(w_ptr + cols, mask=ok, other=0.0)
        y = (w.to(tl.float32) * y.to(tl.float32)).to(x.dtype)
    tl.store(out_ptr + row * stride_o + cols, y, mask=ok)


@triton.jit
def _softmax_kernel(x_ptr, out_ptr, width, stride_x, stride_o, LOG: tl.constexpr,
                    CHUNK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    cols = tl.arange(0, CHUNK)
    m = tl.max(tl.full((CHUNK,), float("-inf"), tl.float32), axis=0)
    s = tl.sum(tl.zeros((CHUNK,), tl.float32), axis=0)
    for c0 in range(0, width, CHUNK):
        x = tl.load(x_row + c0 + cols, mask=c0 + cols < width, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
    log_s = tl.log(s)
    for c0 in range(0, width, CHUNK):
        ok = c0 + cols < width
        x = tl.load(x_row + c0 + cols, mask=ok, other=float("-inf")).to(tl.float32)
        if LOG:
            y = x - m - log_s
        else:
            y = tl.exp(x - m) / s
        tl.store(out_ptr + row * stride_o + c0 + cols, y, mask=ok)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float,
             folded: bool = False) -> torch.Tensor:
    """RMSNorm over the last dim (normalised in fp32, cast back, then scaled by ``weight`` if
    given). ``folded``: model/fused.py's form x / sqrt(sum x^2 + eps), eps already n * eps (the
    weight and sqrt(n) live in the next matmul)."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).contiguous()
    out = torch.empty_like(x2)
    if x2.shape[0]:
        _rms_norm_kernel[(x2.shape[0],)](x2, x2 if weight is None else weight, out, shape[-1],
                                         x2.stride(0), out.stride(0), eps,
                                         1.0 if folded else float(shape[-1]),
                                         HAS_WEIGHT=weight is not None,
                                         BLOCK=triton.next_power_of_2(shape[-1]))
    return out.view(shape)


def softmax(x: torch.Tensor, log: bool) -> torch.Tensor:
    """(log-)softmax over the last dim -> fp32."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).contiguous()
    out = torch.empty(x2.shape, dtype=torch.float32, device=x.device)
    if x2.shape[0]:
        chunk = min(SOFTMAX_CHUNK, triton.next_power_of_2(shape[-1]))
        _softmax_kernel[(x2.shape[0],)](x2, out, shape[-1], x2.stride(0), out.stride(0),
                                        LOG=log, CHUNK=chunk)
    return out.view(shape)
