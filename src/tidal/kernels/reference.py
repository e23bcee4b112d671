"""Pure-torch batch-invariant counterparts of the Triton kernels: kernels/checks.py runs its
accuracy and invariance checks on them where no Triton is at hand (tests/test_kernels.py). The
model's CPU op sets are tidal.numerics' (faster, probed at start-up); these are for the checks.

Every reduction here is a fixed binary tree over the reduced axis (``tree_sum``): the input is
zero-padded to a power of two and halved by elementwise adds. An elementwise add rounds each
element on its own, so a row's result is the same bits whatever else is in the tensor (1 row or
10,000) and whatever order torch schedules the work in. That makes these ops invariant by
construction, at the cost of speed: they are for tiny models on the CPU and for tests.

One CPU hazard is handled too: torch's CPU elementwise loops run full SIMD vectors and a scalar
tail, and transcendental functions (exp, log, sigmoid) can differ by one ulp between the two
paths, so the same number may round differently depending on where it falls in the tensor.
``uniform_map`` pads every such call to a multiple of 64 elements, so every element takes the
vector path (with one torch thread: the CPU benchmark sets it, tests pin it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

SIMD_MULTIPLE = 64
"""Elements per padded transcendental call: a multiple of every SIMD width torch uses on x86."""
ROW_CHUNK = 256
"""Rows per slice in ``linear``/experts, bounding the [rows, N, K] product in memory; slicing
rows never changes a row's result (each row is computed on its own)."""
KEY_BLOCK = 16
"""Keys per block of the attention's online softmax (the Triton kernel uses its own size)."""


def tree_sum(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Sum over ``dim`` by a fixed pairwise tree: same bits for a row whatever the other rows."""
    x = x.movedim(dim, -1)
    width = x.shape[-1]
    size = 1 << max(width - 1, 0).bit_length()
    if size != width:
        x = F.pad(x, (0, size - width))
    while x.shape[-1] > 1:
        half = x.shape[-1] // 2
        x = x[..., :half] + x[..., half:]
    return x[..., 0]


def uniform_map(fn, x: torch.Tensor) -> torch.Tensor:
    """``fn`` applied elementwise, with the call padded so every element takes the SIMD path."""
    flat = x.reshape(-1)
    pad = (-flat.numel()) % SIMD_MULTIPLE
    if pad:
        flat = torch.cat((flat, flat.new_zeros(pad)))
    return fn(flat)[: x.numel()].view(x.shape)


def linear(x: torch.Tensor, weight: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x [M, K] @ weight[N, K].T -> [M, N]: fp32 products summed by ``tree_sum`` over K."""
    w = weight.float()
    outs = [tree_sum(x[i : i + ROW_CHUNK].float()[:, None, :] * w[None], -1)
            for i in range(0, x.shape[0], ROW_CHUNK)]
    out = torch.cat(outs) if outs else x.new_zeros((0, weight.shape[0]), dtype=torch.float32)
    return out.to(out_dtype or x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim, normalised in fp32, cast back, then scaled (as transformers)."""
    h = x.float()
    mean_sq = tree_sum(h * h, -1) / h.shape[-1]
    h = h * torch.rsqrt(mean_sq + eps)[..., None]
    return weight * h.to(x.dtype)


def softmax(x: torch.Tensor, log: bool) -> torch.Tensor:
    """(log-)softmax over the last dim of fp32 rows."""
    x = x.float()
    shifted = x - x.amax(-1, keepdim=True)
    exp = uniform_map(torch.exp, shifted)
    total = tree_sum(exp, -1)[..., None]
    return shifted - uniform_map(torch.log, total) if log else exp / total


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's silu(gate) * up, elementwise (SIMD-uniform)."""
    return uniform_map(F.silu, gate.contiguous()) * up


def attention(q, k_cache, v_cache, slot, pos, scale: float) -> torch.Tensor:
    """q [N, Hq, D]; caches [S, Hkv, L, D]; query n attends to positions 0..pos[n] of slot[n].

    Online softmax over fixed key blocks, every query running the same number of blocks (those
    wholly past its position add exact zeros), so a query's result does not depend on the others.
    """
    n, hq, d = q.shape
    hkv = k_cache.shape[1]
    group = hq // hkv
    last = int(pos.max()) + 1 if n else 0
    blocks = -(-last // KEY_BLOCK)
    qf = q.float().view(n, hkv, group, d)
    m = torch.full((n, hkv, group), float("-inf"))
    l = torch.zeros((n, hkv, group))
    acc = torch.zeros((n, hkv, group, d))
    padded = blocks * KEY_BLOCK - last  # zero keys past the cache's end, masked below
    k_all = F.pad(k_cache[slot][:, :, :last].float(), (0, 0, 0, padded))  # [N, Hkv, keys, D]
    v_all = F.pad(v_cache[slot][:, :, :last].float(), (0, 0, 0, padded))
    for b in range(blocks):
        keys = torch.arange(b * KEY_BLOCK, (b + 1) * KEY_BLOCK)
        k, v = k_all[:, :, keys], v_all[:, :, keys]  # [N, Hkv, Bk, D]
        s = tree_sum(qf[:, :, :, None, :] * k[:, :, None], -1) * scale  # [N, Hkv, G, Bk]
        s = s.masked_fill((keys[None, :] > pos[:, None])[:, None, None, :], float("-inf"))
        m_new = torch.maximum(m, s.amax(-1))
        alpha = uniform_map(torch.exp, m - m_new)
        p = uniform_map(torch.exp, s - m_new[..., None])
        l = l * alpha + tree_sum(p, -1)
        acc = acc * alpha[..., None] + tree_sum(p[..., None] * v[:, :, None], -2)
        m = m_new
    return (acc / l[..., None]).view(n, hq, d).to(q.dtype)


def grouped_linear(x: torch.Tensor, weights: torch.Tensor, expert: torch.Tensor) -> torch.Tensor:
    """Row r of x [A, K] times weights[expert[r]] [N, K].T -> [A, N] (each row on its own)."""
    outs = []
    for i in range(0, x.shape[0], ROW_CHUNK):
        w = weights[expert[i : i + ROW_CHUNK]].float()  # [rows, N, K]
        outs.append(tree_sum(x[i : i + ROW_CHUNK].float()[:, None, :] * w, -1))
    if not outs:
        return x.new_zeros((0, weights.shape[1]))
    return torch.cat(outs).to(x.dtype)


def experts(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, gate_up: torch.Tensor,
            down: torch.Tensor) -> torch.Tensor:
    """x [M, H] through experts ids [M, k] (gate_up [E, 2I, H], down [E, H, I]), each
    assignment on its own row, the k outputs weighted and added in top-k order in fp32."""
    m, k = ids.shape
    inter = down.shape[2]
    flat = ids.reshape(-1)
    token = torch.arange(m, device=x.device).repeat_interleave(k)
    h = grouped_linear(x[token], gate_up, flat)
    y = grouped_linear(silu_mul(h[:, :inter], h[:, inter:]), down, flat)
    y = y.view(m, k, -1).float() * weights.float()[..., None]
    total = y[:, 0]
    for j in range(1, k):
        total = total + y[:, j]
    return total.to(x.dtype)

