"""Batch-invariant ops: each output row's bits depend on that row's inputs only, never on how
many other rows (batch size, sequence length, cached keys) share the call.

Why: RL compares the engine's sampling logprob with the trainer's recomputation of it. The engine
decodes one token against a KV cache inside a batch of whatever size is running; the trainer
runs the full sequence in a padded batch. With torch's default kernels the two differ in the last
bits, because a kernel picks its summation order by the shape of the call. Measured on this
project's CPU (torch 2.13, AMD EPYC, 1 and 2 threads; tests/test_numerics_ops.py re-checks each):

- fp32 ``F.linear`` (MKL) gives different bits for 1, 2-3 and >= 4 rows, and with 2 threads also
  between large row counts; oneDNN's linear on a weight packed once gives the same bits for every
  row count and thread count -> ``DeterministicLinear`` (fp32). bf16 ``F.linear`` is row-invariant.
- fp32 batched ``matmul`` is row-invariant from 4 rows per matrix, whatever the column count,
  batch count or thread count; 1-3 rows take other kernels -> ``attention`` pads to 4 rows.
- ``scaled_dot_product_attention`` for one query against a cache differs from the full causal
  forward (its reductions run over the key length) -> ``attention`` sums over fixed-size key
  blocks and combines the blocks strictly in order (cumsum), so keys past a query, whether masked
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
"""Batch size oneDNN lays packed weights out for; fixed, so every packing gives the same layout."""


def _onednn(weight: torch.Tensor) -> bool:
    return (weight.device.type == "cpu" and weight.dtype == torch.float32
            and torch.backends.mkldnn.is_available())


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

    __slots__ = ("weight", "packed")

    def __init__(self, weight: torch.Tensor):
        self.weight = weight
        self.packed = None
        if _onednn(weight) and not weight.requires_grad:
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, _PACK_HINT_ROWS)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not _onednn(self.weight):  # bf16 (row-invariant as is), or no oneDNN
            return F.linear(x, self.weight)
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")
        packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), _PACK_HINT_ROWS)
        return _PackedLinearFunction.apply(x, self.weight, packed)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm: torch's fused kernel at whole-vector widths, else qwen3.RMSNorm's composed math
    (fp32 statistics, cast back before the weight), so bf16 never reaches rsqrt."""
    if x.shape[-1] % VECTOR_MULTIPLE == 0:
        return F.rms_norm(x, weight.shape, weight, eps)
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


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


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """Grouped-query softmax attention whose every output row is independent of the key length
    and of the other queries.

    q [B, kv_heads, M, D] (the q heads of each kv head, flattened with the queries); k, v
    [B, kv_heads, L, D] with L a multiple of KEY_BLOCK; visible [B, 1 | kv_heads, M, L] bool
    (every row must see at least one key; ``pad_visible`` it once per forward when M < 4 to save
    a copy per layer). Returns [B, kv_heads, M, D] in q's dtype.

    Scores use one matmul (row-invariant at >= 4 rows, so short q is padded); the softmax uses
    the row's exact max over all keys; each block's sum and p @ v reduce over KEY_BLOCK keys; the
    blocks are added in order by cumsum, whose last entry is the same for a query whatever number
    of all-invisible blocks follow its own.
    """
    b, h, m, d = q.shape
    length = k.shape[2]
    if length % KEY_BLOCK:
        raise ValueError(f"attention needs a key length that is a multiple of {KEY_BLOCK}, got {length}")
    if m < MIN_MATMUL_ROWS:  # zero rows; their output is dropped
        q = F.pad(q, (0, 0, 0, MIN_MATMUL_ROWS - m))
    if visible.shape[2] < q.shape[2]:
        visible = pad_visible(visible)
    scores = torch.matmul(q * d**-0.5, k.transpose(-1, -2)).float()  # [B, h, M', L]
    scores = scores.masked_fill(~visible, float("-inf"))
    top = scores.detach().amax(dim=-1, keepdim=True)
    p = torch.exp(scores - top)
    blocks = length // KEY_BLOCK
    p = p.unflatten(-1, (blocks, KEY_BLOCK))  # [B, h, M', nb, KB]
    sums = p.sum(-1).cumsum(-1)[..., -1:]  # [B, h, M', 1]
    per_block = torch.matmul(
        p.to(v.dtype).transpose(2, 3), v.unflatten(2, (blocks, KEY_BLOCK))
    )  # [B, h, nb, M', D]
    out = per_block.float().cumsum(2)[:, :, -1] / sums
    return out[:, :, :m].to(q.dtype)


def pad_visible(visible: torch.Tensor) -> torch.Tensor:
    """Attention's visibility mask [B, h, M, L] with the rows ``attention`` pads short queries
    with (M < MIN_MATMUL_ROWS) appended; padded rows see every key (their output is dropped)."""
    pad = MIN_MATMUL_ROWS - visible.shape[2]
    if pad <= 0:
        return visible
    return torch.cat((visible, visible.new_ones(*visible.shape[:2], pad, visible.shape[3])), dim=2)
