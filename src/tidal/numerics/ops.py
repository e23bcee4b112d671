"""Batch-invariant ops: each output row's bits depend on that row's inputs only, never on how
many other rows (batch size, sequence length, cached keys) share the call.

Why: RL compares the engine's sampling logprob with the trainer's recomputation of it. The engine
decodes one token against a KV cache inside a batch of whatever size is running; the trainer
runs the full sequence in a padded batch. With torch's default kernels the two differ in the last
bits, because a kernel picks its summation order by the shape of the call.

Two kinds of guarantee, kept apart:

- By construction (holds on any CPU): ``attention`` sums p @ v over fixed blocks of KEY_BLOCK keys
  combined strictly in order, so keys past a query (masked future keys, an unused cache tail) add
  exact zeros, and the key length never changes a row's reduction; the q heads of a kv head are
  padded to at least MIN_MATMUL_ROWS matmul rows, so a decode step (T = 1) and a prefill run the
  same shapes per matrix. The bf16 ``fp32-accumulate`` linear upcasts exactly and rounds once, so
  it inherits the fp32 kernel's invariance. Elementwise +, *, /, exp, fma and sqrt round once per element.
- Facts of a kernel on one machine (instruction set, dtype, thread count): whether oneDNN's packed
  fp32 linear, bf16 ``F.linear``, batched matmul, softmax and torch's fused silu / rms_norm give
  a row the same bits whatever else is in the call. They differ between machines of one kind (bf16
  ``F.linear`` holds on an AMD EPYC with native bf16 and fails on an Intel Xeon without it, at
  row counts like 7, 13, 51), so none is assumed: ``tidal.numerics.probe`` checks each op's
  candidate paths at start-up at the model's shapes and the forward runs the first that holds.
  ``tidal doctor`` prints the outcome. Tests run the bitwise suite at every instruction-set level
  the machine supports (``ONEDNN_MAX_CPU_ISA``, ``ATEN_CPU_CAPABILITY``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

MIN_MATMUL_ROWS = 4
"""Rows per matrix ``attention`` pads its matmuls to, so one query (decode) and many (prefill)
take the same kernels (1-3 rows take other kernels in MKL's batched matmul)."""
KEY_BLOCK = 64
"""Keys per attention block; a KV cache used with ``attention`` holds a multiple of it."""
_PACK_HINT_ROWS = 64
"""Batch size oneDNN lays packed weights out for; fixed, so every packing gives the same layout
(measured the same from 2 to 256 rows)."""


def onednn_usable(weight: torch.Tensor) -> bool:
    """Whether oneDNN's packed linear applies to ``weight``: CPU, fp32, torch built with mkldnn.
    Shared with numerics/fast.py (PackedLinear)."""
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
        return (*linear_grads(ctx, grad), None)


def linear_grads(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(grad of x, grad of weight) of y = x @ weight.T (x and weight saved on ``ctx``), each one
    plain matmul in the weight's dtype, cast back to x's for x's grad."""
    x, weight = ctx.saved_tensors
    grad = grad.to(weight.dtype)
    grad_x = grad_w = None
    if ctx.needs_input_grad[0]:
        grad_x = grad.matmul(weight).to(x.dtype)
    if ctx.needs_input_grad[1]:
        grad_w = grad.reshape(-1, grad.shape[-1]).t().matmul(x.reshape(-1, x.shape[-1]).to(weight.dtype))
    return grad_x, grad_w


LINEAR_PATHS: dict[torch.dtype, tuple[str, ...]] = {
    torch.float32: ("onednn", "onednn-padded", "split-k", "reduce"),
    torch.bfloat16: ("native", "native-padded", "fp32-accumulate", "split-k", "reduce"),
}
"""Candidate paths of ``DeterministicLinear`` per dtype, fastest first; probe.py picks the first
that is batch-invariant here. onednn: oneDNN's linear on a weight packed once (fp32). native:
``F.linear`` in the dtype. -padded: the same kernel with a one-row call made two rows (a zero row
added, its output dropped): one row alone takes another kernel (a GEMV) that can sum in another
order than the GEMM of two rows or more (docs/numerics.md, "-padded"); it costs one row at
batch-1 decode only. fp32-accumulate: the bf16 operands upcast to fp32 (exact: a bf16 value
is an fp32 value, and so is the product of two), oneDNN's packed fp32 linear, one rounding to
bf16 at the end; on a CPU without native bf16 it is also ~4x faster than bf16 ``F.linear``.
split-k: the input width cut into blocks of SPLIT_K columns, each block's product a packed fp32
oneDNN linear (bf16 operands upcast exactly), the blocks' outputs added in order, one rounding at
the end: the invariance of the kernel at width SPLIT_K carried to any width.
reduce: no GEMM at all: each output is the elementwise product of its row and the weight's row,
summed by ATen's row reduction (``sum(-1)``) in fp32, whose order depends only on the input width
(a one-row GEMM call is no way out: MKL's fp32 GEMV changes with the thread count); ~10-50x slower
than a GEMM, the last resort."""
SPLIT_K = 512
"""Input columns per block of the split-k linear path."""
REDUCE_CHUNK_ELEMENTS = 1 << 22
"""The reduce path's temporary [rows, out, in] product is made this many elements at a time."""


class DeterministicLinear:
    """y = x @ weight.T, row-invariant on the path ``path`` (LINEAR_PATHS; None: the first
    candidate for the weight's dtype, unchecked: probe.choose_paths gives the checked one).
    ``weight`` [out, in] may require grad (trainer): a packed copy is then made per call (a copy
    of the matrix, cheap beside the matmul)."""

    __slots__ = ("weight", "packed", "path", "kernel", "wide", "blocks")

    def __init__(self, weight: torch.Tensor, path: str | None = None):
        self.weight = weight
        self.path = path or LINEAR_PATHS.get(weight.dtype, ("native",))[0]
        self.kernel = self.path.removesuffix("-padded")
        """The path without its one-row padding: what computes the product."""
        self.wide = weight.dtype != torch.float32 and self.kernel != "native"
        """The path computes in fp32 and rounds once at the end."""
        if self.kernel != "native" and self.kernel != "reduce" and not onednn_usable(weight.float()):
            raise ValueError(f"linear path {self.path!r} needs oneDNN on the CPU")
        self.packed = None
        if self.kernel in ("onednn", "fp32-accumulate") and not weight.requires_grad:
            self.packed = pack_for_onednn(weight.float())
        self.blocks: list[tuple[int, int, torch.Tensor | None]] = []
        """split-k: (first column, end column, packed block or None when built per call)."""
        if self.kernel == "split-k":
            width = weight.shape[-1]
            self.blocks = [(a, min(a + SPLIT_K, width), None if weight.requires_grad else
                            pack_for_onednn(weight[:, a : a + SPLIT_K].float().contiguous()))
                           for a in range(0, width, SPLIT_K)]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.path.endswith("-padded") and x.numel() == x.shape[-1]:
            two = self._product(F.pad(x.reshape(1, -1), (0, 0, 0, 1)))
            return two[:1].view(*x.shape[:-1], two.shape[-1])
        return self._product(x)

    def _product(self, x: torch.Tensor) -> torch.Tensor:
        path = self.kernel
        if path == "native":
            return F.linear(x, self.weight)
        wx = x.float() if self.wide else x
        if path == "reduce":
            weight = self.weight.float() if self.wide else self.weight
            rows = wx.reshape(-1, wx.shape[-1])
            chunk = max(1, REDUCE_CHUNK_ELEMENTS // weight.numel())
            pieces = [(rows[i : i + chunk, None, :] * weight).sum(-1)
                      for i in range(0, rows.shape[0], chunk)]
            out = torch.cat(pieces) if pieces else rows.new_zeros(0, weight.shape[0])
            out = out.view(*x.shape[:-1], weight.shape[0])
        elif path == "split-k":
            if self.weight.requires_grad and torch.is_grad_enabled():
                return _SplitKLinearFunction.apply(x, self.weight, self.blocks)
            out = split_k_linear(wx, self.weight, self.blocks)
        elif self.packed is not None:
            out = torch.ops.mkldnn._linear_pointwise(wx, self.packed, None, "none", [], "")
        else:
            weight = self.weight.float() if self.wide else self.weight
            out = _PackedLinearFunction.apply(wx, weight, pack_for_onednn(weight))
        return out.to(x.dtype) if self.wide else out


def split_k_linear(wx: torch.Tensor, weight: torch.Tensor, blocks) -> torch.Tensor:
    """The split-k path's fp32 product: wx (fp32) @ weight.T as packed oneDNN linears over
    ``blocks`` of input columns (packed once, or packed now where None), added in order."""
    out = None
    for a, b, packed in blocks:
        if packed is None:
            packed = pack_for_onednn(weight[:, a:b].detach().float().contiguous())
        part = torch.ops.mkldnn._linear_pointwise(wx[..., a:b].contiguous(), packed, None, "none", [], "")
        out = part if out is None else out + part
    return out


class _SplitKLinearFunction(torch.autograd.Function):
    """The split-k linear with a backward of one matmul per input over the whole width in the
    weight's dtype: only the forward's bits must match the engine's, and a per-block fp32
    backward costs ~3x as much."""

    @staticmethod
    def forward(ctx, x, weight, blocks):
        ctx.save_for_backward(x, weight)
        out = split_k_linear(x.float(), weight, blocks)
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        return (*linear_grads(ctx, grad), None)


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


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float, path: str = "torch") -> torch.Tensor:
    """RMSNorm on the path ``path`` (ROWWISE_PATHS): torch's fused kernel, or qwen3.RMSNorm's
    composed math (fp32 statistics, cast back before the weight, so bf16 never reaches rsqrt).
    Weight None: the normalised x alone."""
    if path == "torch":
        return F.rms_norm(x, x.shape[-1:], weight, eps)
    h = x.float()
    h = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return h if weight is None else weight * h


def silu(x: torch.Tensor, path: str = "torch") -> torch.Tensor:
    """x * sigmoid(x) on the path ``path``: torch's kernel, or x / (1 + exp(-x)) in fp32, cast
    back (exp, add and divide round the same in torch's vector and scalar code)."""
    if path == "torch":
        return F.silu(x)
    h = x.float()
    return (h / (1.0 + torch.exp(-h))).to(x.dtype)


ROWWISE_PATHS: dict[str, tuple[str, ...]] = {
    "silu": ("torch", "composed"),
    "rms_norm": ("torch", "composed"),
    "folded_rms_norm": ("composed",),
    "softmax": ("torch",),
}
"""Candidate paths of the row-wise ops, fastest first. torch's fused kernels take a scalar path
for a tensor's tail elements whose rounding can differ from the vector path (measured on fp32
silu and bf16 rsqrt at widths that are not a multiple of the vector), so whether they hold
depends on the width, the dtype and the instruction set: probe.py checks at the model's widths."""


def rowwise_op(op: str, path: str):
    """The one-argument function probe.py checks for a row-wise op on a path."""
    eps = torch.tensor(1e-6)
    return {
        "silu": lambda x: silu(x, path),
        "rms_norm": lambda x: rms_norm(x, None, 1e-6, path),
        "folded_rms_norm": lambda x: folded_rms_norm(x, (x.shape[-1] * eps).to(x.dtype)),
        "softmax": lambda x: torch.softmax(x.float(), dim=-1),
    }[op]


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


ATTENTION_PATHS: dict[torch.dtype, tuple[str, ...]] = {
    torch.float32: ("unpadded", "padded"),
    torch.bfloat16: ("keys-first", "unpadded", "padded", "padded-fp32"),
}
"""Candidate paths of ``attention``, fastest first. unpadded: a decode step's matmuls have as
many rows per kv head as it has q heads (fine where the batched matmul's few-row kernels sum
like its many-row ones: probed); padded: at least MIN_MATMUL_ROWS rows, so one query and many
take the same kernels; -fp32: q, k and v upcast first (exact), the output rounded once.
keys-first (bf16): unpadded, with the scores computed as (keys @ queries^T)^T, keys the matmul's
rows: bf16 ``bmm`` copies a transposed right operand, and the keys' transpose of a decode step is
the whole cache window, most of the score matmul's time; in fp32 the transposed form is the
faster one, so fp32 keeps it (docs/training.md, "More RL steps per CPU-second")."""
UNPADDED_PATHS = ("unpadded", "keys-first")
"""The attention paths that do not pad a kv head's q heads to MIN_MATMUL_ROWS."""


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor,
              path: str = "padded") -> torch.Tensor:
    """Grouped-query softmax attention whose every output row is independent of the key length
    and of the other queries.

    q [B, T, heads, D] (any strides); k, v [B, kv_heads, L, D] with L a multiple of KEY_BLOCK;
    bias [B, 1, T, 1, L] from ``attention_bias`` (every query must see at least one key).
    Returns [B, T, heads * D] in q's dtype.

    The q heads sharing a kv head are that kv head's matmul rows, T x group of them; on the
    padded paths padded with zero heads to at least MIN_MATMUL_ROWS (a decode step has T = 1) so
    both matmuls stay on the same kernels (ATTENTION_PATHS). Scores: one matmul over all L keys (invariant in the column
    count); softmax over L in fp32 (torch's last-dim kernel reduces each row in vector lanes in
    order, so keys past the query, at -inf, add exact zeros: measured invariant for L = 64..512);
    p @ v per KEY_BLOCK keys (one matmul over the whole L is not invariant in L: measured), the
    blocks added in order in fp32, so the all-zero blocks past a query's own add exact zeros.
    Matmuls take 3-D views of k and v (a KV cache's rows are read in place, never copied).
    """
    out_dtype = q.dtype
    if path.endswith("fp32") and q.dtype != torch.float32:
        q, k, v = q.float(), k.float(), v.float()
    b, t, heads, d = q.shape
    kv_heads, length = k.shape[1], k.shape[2]
    if length % KEY_BLOCK:
        raise ValueError(f"attention needs a key length that is a multiple of {KEY_BLOCK}, got {length}")
    group = heads // kv_heads
    min_rows = 1 if path in UNPADDED_PATHS else MIN_MATMUL_ROWS
    padded = max(group, -(-min_rows // t))  # q heads per kv head and query, with padding
    q = q.unflatten(2, (kv_heads, group))  # [B, T, kv_heads, group, D]
    if padded > group:
        q = F.pad(q, (0, 0, 0, padded - group))
    rows = q.permute(0, 2, 1, 3, 4).reshape(b * kv_heads, t * padded, d)
    keys, values = k.flatten(0, 1), v.flatten(0, 1)  # [B * kv_heads, L, D]
    if path == "keys-first":
        scores = torch.bmm(keys, rows.transpose(1, 2)).transpose(1, 2)
    else:
        scores = torch.bmm(rows, keys.transpose(1, 2))
    scores = scores.float().view(b, kv_heads, t, padded, length)
    p = torch.softmax(scores + bias, dim=-1).to(v.dtype).view(b * kv_heads, t * padded, length)
    if torch.is_grad_enabled() and (p.requires_grad or values.requires_grad):
        out = _BlockedPV.apply(p, values)
    else:
        out = blocked_pv(p, values)
    out = out.view(b, kv_heads, t, padded, d)
    if padded > group:
        out = out[:, :, :, :group]
    return out.permute(0, 2, 1, 3, 4).reshape(b, t, heads * d).to(out_dtype)


def blocked_pv(p: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """p [N, R, L] @ values [N, L, D] -> [N, R, D] in values' dtype, as KEY_BLOCK-key matmuls
    added in order in fp32 (see ``attention``)."""
    out = None
    for start in range(0, p.shape[-1], KEY_BLOCK):
        block = torch.bmm(p[:, :, start : start + KEY_BLOCK], values[:, start : start + KEY_BLOCK])
        out = block if out is None else out.float() + block.float()
    return out.to(values.dtype)


class _BlockedPV(torch.autograd.Function):
    """``blocked_pv`` with a backward of one matmul per input. Autograd through the block loop
    would give each slice of p its own zero-filled gradient the size of all of p (measured: ~30%
    of an RL trainer step in fill_ and the slicing backward); the gradients need not match
    anything bit for bit, only the forward's logprobs do."""

    @staticmethod
    def forward(ctx, p, values):
        ctx.save_for_backward(p, values)
        return blocked_pv(p, values)

    @staticmethod
    def backward(ctx, grad):
        p, values = ctx.saved_tensors
        grad = grad.to(values.dtype)
        grad_p = torch.bmm(grad, values.transpose(1, 2)) if ctx.needs_input_grad[0] else None
        grad_v = torch.bmm(p.transpose(1, 2), grad) if ctx.needs_input_grad[1] else None
        return grad_p, grad_v


def apply_rope_fused(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """apply_rope in three kernels instead of four (addcmul does the second product and the
    sum); its rounding may differ from apply_rope's in the last bit. The fused forward (model/fused.py) uses it in every op set."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), sin_signed)
