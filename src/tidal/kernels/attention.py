"""One attention kernel for prefill, decode and the trainer's forward, over a KV cache.

Why one kernel: the trainer's causal forward (flash attention) and the engine's decode (one query
against a cache) sum over keys in different orders, so the same token gets different bits. Here
every query, whatever call it is in, is one program (query token x head) that walks its slot's
keys 0..pos in fixed blocks of ``BLOCK_N`` from the left with an online softmax in fp32. The key
blocks, their order and the arithmetic depend only on the query's position, so decode, prefill
(chunked or whole) and the trainer's full-sequence forward produce the same bits. The trainer
writes its sequences' keys and values into a cache-shaped buffer and calls the same kernel.

Speed: decode reads each key once per query head (GQA groups share them through L2); the
trainer's forward is slower than flash attention (no tensor cores), which the benchmark does not
time: the engine's throughput is what the mode costs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_N = 64
"""Keys per block of the online softmax (fixed: part of every query's reduction order)."""


@triton.jit
def _attention_kernel(q_ptr, k_ptr, v_ptr, out_ptr, slot_ptr, pos_ptr, scale,
                      stride_qn, stride_qh, stride_ks, stride_kh, stride_kl,
                      stride_on, stride_oh, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
                      BLOCK_N: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    kv_head = (head // GROUP).to(tl.int64)
    slot = tl.load(slot_ptr + n).to(tl.int64)
    pos = tl.load(pos_ptr + n).to(tl.int32)
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + n * stride_qn + head * stride_qh + d).to(tl.float32)
    base = slot * stride_ks + kv_head * stride_kh
    m = tl.max(tl.full((BLOCK_N,), float("-inf"), tl.float32), axis=0)
    l = tl.sum(tl.zeros((BLOCK_N,), tl.float32), axis=0)
    acc = tl.zeros((HEAD_DIM,), tl.float32)
    for start in range(0, pos + 1, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        ok = keys <= pos
        offs = base + keys.to(tl.int64)[:, None] * stride_kl + d[None, :]
        k = tl.load(k_ptr + offs, mask=ok[:, None], other=0.0).to(tl.float32)
        s = tl.sum(k * q[None, :], axis=1) * scale
        s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=0))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new)
        l = l * alpha + tl.sum(p, axis=0)
        v = tl.load(v_ptr + offs, mask=ok[:, None], other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        m = m_new
    out = acc / l
    tl.store(out_ptr + n * stride_on + head * stride_oh + d, out.to(out_ptr.dtype.element_ty))


def attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
              slot: torch.Tensor, pos: torch.Tensor, scale: float) -> torch.Tensor:
    """q [N, Hq, D]; caches [S, Hkv, L, D] (D contiguous); query n attends to positions
    0..pos[n] of slot[n] (all must be >= 0, keys already written) -> [N, Hq, D]."""
    n, hq, d = q.shape
    hkv = k_cache.shape[1]
    assert d == triton.next_power_of_2(d), f"head_dim must be a power of two, got {d}"
    assert k_cache.stride(3) == 1 and v_cache.stride() == k_cache.stride()
    q = q.contiguous()
    out = torch.empty_like(q)
    if n == 0:
        return out
    _attention_kernel[(n, hq)](q, k_cache, v_cache, out, slot, pos, scale,
                               q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
                               k_cache.stride(2), out.stride(0), out.stride(1),
                               GROUP=hq // hkv, HEAD_DIM=d, BLOCK_N=BLOCK_N, num_warps=4)
    return out
