"""Fused Triton kernels of deterministic mode: fewer launches per decode step, same invariance.

Why: on a GPU a small-batch decode step is bound by the host (one kernel launch plus Python per
op), not by memory, so each torch glue op between the batch-invariant kernels costs as much as
a kernel (the second H200 run: ~17-19 ms per 12-layer step). Each kernel here replaces a chain
of torch ops with one launch; every program owns one row (token, head or expert) and its
arithmetic depends on that row alone, so decode, prefill and the trainer's forward still give
the same bits.

- ``qkv_to_cache``: q/k norm (per-head weights, RMSNorm or model/fused.py's folded form; for
  Llama, which has none, only the per-head multiplier) + RoPE of the fused qkv projection, k and
  v written to the KV cache, q returned (was: 2 copies, 2 norms, 10 rope ops, 2 cache writes, 4
  table gathers).
- ``route``: router softmax, its own top-k, the ids to use (those or the replayed ones), gates
  and their ordered renormalisation (was: softmax, topk, gather, k adds, a division).
- ``align_by_expert``: assignments sorted by expert into whole tiles, one program per expert
  (was: ~25 torch ops: argsort, scatter-add counts, cumsums, searchsorted, ...).
- ``combine``: residual + the top-k expert outputs weighted and summed in top-k order in fp32
  (was: casts, k multiplies and adds, a cast, the residual add).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

ALIGN_CHUNK = 256
"""Assignment ids read per step by ``align_by_expert`` (bounds its [experts, chunk] compare)."""
COMBINE_BLOCK = 1024
"""Hidden columns per program of ``combine``."""


@triton.jit
def _qkv_kernel(qkv_ptr, norm_ptr, cos_ptr, sin_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr,
                slot_ptr, pos_ptr, eps, width_div, stride_qkv, stride_rope, stride_qo,
                stride_cs, stride_ch, stride_cl, HQ: tl.constexpr, HKV: tl.constexpr,
                D: tl.constexpr, NORMED: tl.constexpr = True):
    """Program (token, head of q|k|v): v copied to the cache; q/k normalised (x * 1 /
    sqrt(sum x^2 / width_div + eps), cast back, times the head's norm weight; NORMED False:
    only times the weight), rotated (x * cos + x.roll(D/2) * sin_signed, each product rounded
    to the input dtype as torch does), q stored, k written to the cache. A token at position
    < 0 (padding) writes nothing."""
    n = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    d = tl.arange(0, D)
    src = qkv_ptr + n * stride_qkv + head * D
    x = tl.load(src + d)
    slot = tl.load(slot_ptr + n).to(tl.int64)
    pos = tl.load(pos_ptr + n).to(tl.int64)
    real = pos >= 0
    cache_row = slot * stride_cs + tl.maximum(pos, 0) * stride_cl + d
    if head >= HQ + HKV:
        tl.store(v_cache_ptr + cache_row + (head - HQ - HKV) * stride_ch, x, mask=real & (d < D))
    else:
        rot = (d + D // 2) % D
        xr = tl.load(src + rot)
        w, wr = tl.load(norm_ptr + head * D + d), tl.load(norm_ptr + head * D + rot)
        h = x.to(tl.float32)
        if NORMED:
            inv = 1.0 / tl.sqrt_rn(tl.sum(h * h, axis=0) / width_div + eps)
            xn = (w.to(tl.float32) * (h * inv).to(x.dtype).to(tl.float32)).to(x.dtype)
            xrn = (wr.to(tl.float32) * (xr.to(tl.float32) * inv).to(x.dtype).to(tl.float32)).to(x.dtype)
        else:
            xn = (w.to(tl.float32) * h).to(x.dtype)
            xrn = (wr.to(tl.float32) * xr.to(tl.float32)).to(x.dtype)
        cos = tl.load(cos_ptr + n * stride_rope + d).to(x.dtype).to(tl.float32)
        sin = tl.load(sin_ptr + n * stride_rope + d).to(x.dtype).to(tl.float32)
        a = (xn.to(tl.float32) * cos).to(x.dtype).to(tl.float32)
        b = (xrn.to(tl.float32) * sin).to(x.dtype).to(tl.float32)
        out = (a + b).to(x.dtype)
        if head < HQ:
            tl.store(q_out_ptr + n * stride_qo + head * D + d, out)
        else:
            tl.store(k_cache_ptr + cache_row + (head - HQ) * stride_ch, out, mask=real & (d < D))


def qkv_to_cache(qkv, qk_norm, cos, sin_signed, k_cache, v_cache, slot, pos, heads, eps,
                 width_div, normed: bool = True):
    """qkv [N, (Hq + 2 Hkv) D] (q, k, v heads side by side); qk_norm [Hq + Hkv, D]: each q and k
    head's norm weight; cos/sin_signed [N, D]: each token's RoPE row (model/rope.py's table);
    caches [S, Hkv, L, D]; slot/pos [N] (pos < 0: padding, not written) -> q [N, Hq, D]
    normalised and rotated (k, v now in the caches). The norm is x / sqrt(sum x^2 / width_div
    + eps): width_div = D for RMSNorm, 1 for model/fused.py's folded form (eps = D * eps).
    normed False (Llama: no q/k norms): q and k are only multiplied by qk_norm (eps and
    width_div unused)."""
    hq, hkv, d = heads
    n = qkv.shape[0]
    assert qkv.stride(1) == 1 and k_cache.stride() == v_cache.stride() and k_cache.stride(3) == 1
    assert cos.stride(1) == 1 and cos.stride() == sin_signed.stride()
    assert qk_norm.shape == (hq + hkv, d) and qk_norm.is_contiguous()
    q = torch.empty((n, hq, d), dtype=qkv.dtype, device=qkv.device)
    if n:
        _qkv_kernel[(n, hq + 2 * hkv)](qkv, qk_norm, cos, sin_signed, q, k_cache, v_cache, slot,
                                       pos, eps, width_div, qkv.stride(0), cos.stride(0),
                                       q.stride(0), k_cache.stride(0), k_cache.stride(1),
                                       k_cache.stride(2), HQ=hq, HKV=hkv, D=d, NORMED=normed)
    return q


@triton.jit
def _route_kernel(logits_ptr, ids_ptr, own_ptr, gates_ptr, E, stride_l, REPLAY: tl.constexpr,
                  NORM: tl.constexpr, TOPK: tl.constexpr, K_POW2: tl.constexpr,
                  E_POW2: tl.constexpr):
    """Program = token: softmax over its E logits, its own top-k by repeated argmax, the ids
    to use (those, or the replayed ones), gates = their probabilities, renormalised by their
    sum in top-k order."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, E_POW2)
    ks = tl.arange(0, K_POW2)
    x = tl.load(logits_ptr + row * stride_l + cols, mask=cols < E, other=float("-inf"))
    x = x.to(tl.float32)
    p = tl.exp(x - tl.max(x, axis=0))
    probs = p / tl.sum(p, axis=0)
    own = tl.zeros((K_POW2,), tl.int64)
    left = tl.where(cols < E, probs, -1.0)
    for j in tl.static_range(TOPK):
        best = tl.argmax(left, axis=0)
        own = tl.where(ks == j, best.to(tl.int64), own)
        left = tl.where(cols == best, -2.0, left)
    tl.store(own_ptr + row * TOPK + ks, own, mask=ks < TOPK)
    if REPLAY:
        ids = tl.load(ids_ptr + row * TOPK + ks, mask=ks < TOPK, other=0).to(tl.int64)
    else:
        ids = own
    # one nonzero per row of the compare: an exact gather
    gates = tl.sum(tl.where(cols[None, :] == ids[:, None], probs[None, :], 0.0), axis=1)
    if NORM:
        total = tl.sum(tl.where(ks == 0, gates, 0.0), axis=0)
        for j in tl.static_range(1, TOPK):
            total = total + tl.sum(tl.where(ks == j, gates, 0.0), axis=0)
        gates = gates / total
    tl.store(gates_ptr + row * TOPK + ks, gates, mask=ks < TOPK)


def route(logits: torch.Tensor, k: int, norm: bool, replay: torch.Tensor | None):
    """Router logits [N, E] -> (expert ids [N, k] int64: the top-k, or ``replay``; gates [N, k]
    fp32: softmax probabilities at those ids, renormalised when ``norm``; the router's own
    top-k [N, k], the ids themselves without replay)."""
    n, e = logits.shape
    assert logits.stride(1) == 1
    own = torch.empty((n, k), dtype=torch.int64, device=logits.device)
    ids = own if replay is None else replay.to(torch.int64).contiguous()
    gates = torch.empty((n, k), dtype=torch.float32, device=logits.device)
    if n:
        _route_kernel[(n,)](logits, ids, own, gates, e, logits.stride(0), REPLAY=replay is not None,
                            NORM=norm, TOPK=k, K_POW2=triton.next_power_of_2(k),
                            E_POW2=triton.next_power_of_2(e))
    return ids, gates, own


@triton.jit(do_not_specialize=["A"])
def _align_kernel(ids_ptr, rows_ptr, block_expert_ptr, A, num_blocks, E: tl.constexpr,
                  E_POW2: tl.constexpr, BLOCK_M: tl.constexpr, CHUNK: tl.constexpr):
    """Program = expert e: counts every expert's assignments, so knows where its tiles start
    (experts before it, each padded to whole tiles); writes its assignment ids there in
    ascending order, -1 in its last tile's padding, e as the expert of its tiles. The last
    expert also fills the unused tail (-1 rows, -1 tiles)."""
    e = tl.program_id(0)
    experts = tl.arange(0, E_POW2)
    offs = tl.arange(0, CHUNK)
    counts = tl.zeros((E_POW2,), tl.int32)
    for c0 in range(0, A, CHUNK):
        ids = tl.load(ids_ptr + c0 + offs, mask=c0 + offs < A, other=-1)
        counts += tl.sum((ids[None, :] == experts[:, None]).to(tl.int32), axis=1)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    start = tl.sum(tl.where(experts < e, padded, 0), axis=0)
    mine = tl.sum(tl.where(experts == e, counts, 0), axis=0)
    end = start + tl.sum(tl.where(experts == e, padded, 0), axis=0)
    seen = tl.sum(tl.zeros((CHUNK,), tl.int32), axis=0)
    for c0 in range(0, A, CHUNK):
        ids = tl.load(ids_ptr + c0 + offs, mask=c0 + offs < A, other=-1)
        hit = (ids == e).to(tl.int32)
        rank = seen + tl.cumsum(hit, axis=0) - 1
        tl.store(rows_ptr + start + rank, (c0 + offs).to(tl.int64), mask=hit > 0)
        seen += tl.sum(hit, axis=0)
    pad = tl.arange(0, BLOCK_M)
    tl.store(rows_ptr + start + mine + pad, tl.full((BLOCK_M,), -1, tl.int64),
             mask=start + mine + pad < end)
    for t in range(start // BLOCK_M, end // BLOCK_M):
        tl.store(block_expert_ptr + t, e.to(tl.int64))
    if e == E - 1:
        for r0 in range(end, num_blocks * BLOCK_M, CHUNK):
            tl.store(rows_ptr + r0 + offs, tl.full((CHUNK,), -1, tl.int64),
                     mask=r0 + offs < num_blocks * BLOCK_M)
        for t in range(end // BLOCK_M, num_blocks):
            tl.store(block_expert_ptr + t, -1)


def align_by_expert(expert_ids: torch.Tensor, num_experts: int, block_m: int):
    """routing.align_by_expert in one launch: same outputs (rows, block_expert)."""
    ids = expert_ids.reshape(-1).contiguous()
    blocks = -(-ids.numel() // block_m) + num_experts
    rows = torch.empty((blocks * block_m,), dtype=torch.long, device=ids.device)
    block_expert = torch.empty((blocks,), dtype=torch.long, device=ids.device)
    _align_kernel[(num_experts,)](ids, rows, block_expert, ids.numel(), blocks, E=num_experts,
                                  E_POW2=triton.next_power_of_2(num_experts), BLOCK_M=block_m,
                                  CHUNK=ALIGN_CHUNK)
    return rows, block_expert


@triton.jit
def _combine_kernel(y_ptr, w_ptr, res_ptr, out_ptr, H, TOPK: tl.constexpr, BLOCK: tl.constexpr):
    """Program (token, column block): residual + round(sum_j y[token, j] * w[token, j]), the sum
    in fp32 in top-k order (what ops.ordered_sum does in torch)."""
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < H
    acc = tl.load(y_ptr + t * TOPK * H + cols, mask=ok, other=0.0).to(tl.float32) * tl.load(w_ptr + t * TOPK)
    for j in tl.static_range(1, TOPK):
        y = tl.load(y_ptr + (t * TOPK + j) * H + cols, mask=ok, other=0.0).to(tl.float32)
        acc = acc + y * tl.load(w_ptr + t * TOPK + j)
    res = tl.load(res_ptr + t * H + cols, mask=ok, other=0.0)
    out = (res.to(tl.float32) + acc.to(res.dtype).to(tl.float32)).to(res.dtype)
    tl.store(out_ptr + t * H + cols, out, mask=ok)


def combine(y: torch.Tensor, weights: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
    """y [M * k, H] (token-major expert outputs), weights [M, k] -> [M, H] in y's dtype:
    residual (zeros if None) + the weighted sum in top-k order."""
    m, k = weights.shape
    h = y.shape[1]
    y, w = y.contiguous(), weights.float().contiguous()
    res = torch.zeros((m, h), dtype=y.dtype, device=y.device) if residual is None else residual.contiguous()
    out = torch.empty_like(res)
    if m:
        _combine_kernel[(m, triton.cdiv(h, COMBINE_BLOCK))](y, w, res, out, h, TOPK=k,
                                                            BLOCK=COMBINE_BLOCK)
    return out
