"""Batch-invariant ops: each output row's bits depend on that row's inputs only, never on how
many other rows (batch size, sequence length, cached keys) share the call.

Why: RL compares the engine's sampling logprob with the trainer's recomputation of it. The engine
decodes one token against a KV cache inside a batch of whatever size is running; the trainer
runs the full sequence in a padded batch. With torch's default kernels the two differ in the last
bits, because a kernel picks its summation order by the shape of the call. Measured on this
project's CPU (torch 2.13, AMD EPYC, 1 and 2 threads; tests/test_numerics.py re-checks them):

- fp32 ``F.linear`` (MKL) gives different bits for 1, 2-3 and >= 4 rows, and with 2 threads also
  between large row counts; oneDNN's linear on a weight packed once gives the same bits for every
  row count and thread count -> ``DeterministicLinear`` (fp32). bf16 ``F.linear`` is row-invariant.
- fp32 batched ``matmul`` is row-invariant from 4 rows per matrix, whatever the column count,
  batch count or thread count; 1-3 rows take other kernels -> ``attention`` pads to 4 rows.
- ``scaled_dot_product_attention`` for one query against a cache differs from the full causal
  forward (its reductions run over the key length) -> ``attention`` sums over fixed-size key
  blocks and combines the blocks strictly in order, so keys past a query, whether masked
  future keys or an unused cache tail, add exact zeros and change nothing.
- fp32 ``F.silu`` / ``sigmoid`` take a scalar path for a tensor's tail elements whose rounding
  differs from the vector path: invariant when rows are a whole number of vectors (a last dim
  that is a multiple of ``VECTOR_MULTIPLE``), so ``silu`` uses it there and x / (1 + exp(-x))
  otherwise (exp, add, divide are the same in both paths). bf16 ``rsqrt`` likewise depends on
  length; ``F.rms_norm`` (fp32 statistics) is invariant at such widths, else norms are composed.
- Row reductions (sum, mean, amax), exp, softmax, log_softmax, elementwise +, *, / are invariant.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

MIN_MATMUL_ROWS = 4
"""fp32 batched matmul is row-invariant from this many rows per matrix (see module docs)."""
KEY_BLOCK = 64
"""Keys per attention block; a KV cache used with ``attention`` holds a multiple of it."""
VECTOR_MULTIPLE = 32
"""Row widths (elements) at which torch's fused silu / rms_norm kernels have no scalar tail:
measured invariant at 32..512, fp32 and bf16, views and copies, 1 and 2 threads."""
_PACK_HINT_ROWS = 64
"""Batch size oneDNN lays packed weights out for; fixed, so every packing gives the same layout
(measured the same from 2 to 256 rows)."""


def onednn_usable(weight: torch.Tensor) -> bool:
    """Whether oneDNN's packed linear applies to ``weight``: CPU, fp32, torch built with mkldnn.
    Shared with model/packed_linear.py."""
    return (weight.device.type == "cpu" and weight.dtype == torch.float32
            and torch.backends.mkldnn.is_available())


def pack_for_onednn(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [out, in] (detached) in oneDNN's blocked layout, for ``_linear_pointwise``."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), _PACK_HINT_ROWS)


class _PackedLinearFunction(torch.autograd.Function):
    """y = x @ w.T on oneDNN's packed weight; the backward is ordinary matmuls (the gradients need
    not match anything bit for bit, only the forward's logprobs do)."""

    @staticmethod
    def forward(ctx, x, weight, packed):
        ctx.save_for_backward(x, weight)
        return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:
            grad_x = grad.matmul(weight)
        if ctx.needs_input_grad[1]:
            grad_w = grad.reshape(-1, grad.shape[-1]).t().matmul(x.reshape(-1, x.shape[-1]))
        return grad_x, grad_w, None


class DeterministicLinear:
    """y = x @ weight.T, row-invariant. ``weight`` [out, in] may require grad (trainer): the
    packed copy is then made per call (a copy of the matrix, cheap beside the matmul)."""

    __slots__ = ("weight", "packed", "onednn")

    def __init__(self, weight: torch.Tensor):
        self.weight = weight
        self.onednn = onednn_usable(weight)  # decided once: this is called ~20 times per decode step
        self.packed = None
        if self.onednn and not weight.requires_grad:
            self.packed = pack_for_onednn(weight)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")
        if not self.onednn:  # bf16 (row-invariant as is), or no oneDNN
            return F.linear(x, self.weight)
        packed = pack_for_onednn(self.weight)
        return _PackedLinearFunction.apply(x, self.weight, packed)


def fold_norm_weight(matrix: torch.Tensor, norm_weight: torch.Tensor) -> torch.Tensor:
    """matrix [..., out, in] times the weight [in] of the RMSNorm before it, and sqrt(in), so the
    norm itself is ``folded_rms_norm`` (see there). Differentiable: the trainer folds its
    parameters per forward with this same op, the engine once per weight version."""
    return matrix * (norm_weight * matrix.shape[-1] ** 0.5)


def folded_rms_norm(x: torch.Tensor, width_eps: torch.Tensor) -> torch.Tensor:
    """RMSNorm over the last dim without its weight and its sqrt(n), which the next matmul holds
    (``fold_norm_weight``): x / sqrt(sum x^2 + n * eps), with ``width_eps`` = n * eps (a 0-d
    tensor in x's dtype, made once).

    Why: four kernels (norm, fma, sqrt, divide) instead of F.rms_norm's seven plus the weight
    multiply. Each is row-invariant: the norm is a per-row reduction; fma (addcmul), sqrt and
    divide round exactly once in torch's vector and scalar paths alike (measured), unlike hypot,
    whose vector (Sleef) and scalar (libm) versions need not agree."""
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    return x / torch.addcmul(width_eps, norm, norm).sqrt_()


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """RMSNorm: torch's fused kernel at whole-vector widths, else qwen3.RMSNorm's composed math
    (fp32 statistics, cast back before the weight), so bf16 never reaches rsqrt. Weight None:
    the normalised x alone."""
    if x.shape[-1] % VECTOR_MULTIPLE == 0:
        return F.rms_norm(x, x.shape[-1:], weight, eps)
    h = x.float()
    h = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return h if weight is None else weight * h


def silu(x: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(x): torch's kernel at whole-vector widths, else x / (1 + exp(-x)) in fp32,
    cast back (see the module docs for why)."""
    if x.shape[-1] % VECTOR_MULTIPLE == 0:
        return F.silu(x)
    h = x.float()
    return (h / (1.0 + torch.exp(-h))).to(x.dtype)


def scaled_log_softmax(logits: torch.Tensor, temperature: torch.Tensor | float) -> torch.Tensor:
    """log_softmax(logits / T) in fp32 over the last dim: THE sampling-logprob op, shared by the
    engine (per-row T [B, 1]) and the trainer (one T), so both run the same ops in the same order.
    T = 0 (greedy) is scored as T = 1 by the callers."""
    return torch.log_softmax(logits.float() / temperature, dim=-1)


def attention_bias(query_at: torch.Tensor, length: int) -> torch.Tensor:
    """The additive mask ``attention`` takes, built once per forward: query_at [B, T] (the last key
    each query may see) -> [B, 1, T, 1, length] fp32, 0 where visible and -inf elsewhere. Adding
    it gives the same bits as masking (s + 0 = s, s - inf = -inf) in one contiguous add instead
    of a broadcast masked_fill per layer (~7x slower at 64 decode rows)."""
    visible = torch.arange(length, device=query_at.device) <= query_at.unsqueeze(-1)
    bias = torch.zeros(visible.shape, dtype=torch.float32, device=query_at.device)
    return bias.masked_fill_(~visible, float("-inf")).unsqueeze(1).unsqueeze(3)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Grouped-query softmax attention whose every output row is independent of the key length
    and of the other queries.

    q [B, T, heads, D] (any strides); k, v [B, kv_heads, L, D] with L a multiple of KEY_BLOCK;
    bias [B, 1, T, 1, L] from ``attention_bias`` (every query must see at least one key).
    Returns [B, T, heads * D] in q's dtype.

    The q heads sharing a kv head are that kv head's matmul rows, T x group of them, padded with
    zero heads to at least MIN_MATMUL_ROWS (a decode step has T = 1) so both matmuls stay on
    the row-invariant kernels. Scores: one matmul over all L keys (invariant in the column
    count); softmax over L in fp32 (torch's last-dim kernel reduces each row in vector lanes in
    order, so keys past the query, at -inf, add exact zeros: measured invariant for L = 64..512);
    p @ v per KEY_BLOCK keys (one matmul over the whole L is not invariant in L: measured), the
    blocks added in order in fp32, so the all-zero blocks past a query's own add exact zeros.
    Matmuls take 3-D views of k and v (a KV cache's rows are read in place, never copied).
    """
    b, t, heads, d = q.shape
    kv_heads, length = k.shape[1], k.shape[2]
    if length % KEY_BLOCK:
        raise ValueError(f"attention needs a key length that is a multiple of {KEY_BLOCK}, got {length}")
    group = heads // kv_heads
    padded = max(group, -(-MIN_MATMUL_ROWS // t))  # q heads per kv head and query, with padding
    q = q.unflatten(2, (kv_heads, group))  # [B, T, kv_heads, group, D]
    if padded > group:
        q = F.pad(q, (0, 0, 0, padded - group))
    rows = q.permute(0, 2, 1, 3, 4).reshape(b * kv_heads, t * padded, d)
    keys, values = k.flatten(0, 1), v.flatten(0, 1)  # [B * kv_heads, L, D]
    scores = torch.bmm(rows, keys.transpose(1, 2)).float().view(b, kv_heads, t, padded, length)
    p = torch.softmax(scores + bias, dim=-1).to(v.dtype).view(b * kv_heads, t * padded, length)
    out = None
    for start in range(0, length, KEY_BLOCK):
        block = torch.bmm(p[:, :, start : start + KEY_BLOCK], values[:, start : start + KEY_BLOCK])
        out = block if out is None else out.float() + block.float()
    out = out.to(v.dtype).view(b, kv_heads, t, padded, d)
    if padded > group:
        out = out[:, :, :, :group]
    return out.permute(0, 2, 1, 3, 4).reshape(b, t, heads * d).to(q.dtype)
